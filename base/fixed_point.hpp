// fixed_point: a number as text with a fixed count of decimals, as Python's f"{value:.Nf}" writes
// it (printf rounds the exact binary value half to even, as Python does), so that tables made in
// C++ read as the Python ones they replace. Header-only, no state.
#pragma once

#include <cstdio>
#include <string>

namespace stowage {

inline std::string fixed_point(double value, int decimals) {
  char buffer[352];  // the largest double in full, its decimals and sign
  std::snprintf(buffer, sizeof(buffer), "%.*f", decimals, value);
  return buffer;
}

}  // namespace stowage
