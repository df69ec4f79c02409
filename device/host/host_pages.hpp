// Small helpers shared by the simulated device's files: the host page size and pointer
// arithmetic. Header-only, no state.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>

namespace stowage {

inline std::size_t host_page_size() noexcept {
  static const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

inline std::uintptr_t to_address(const void* pointer) noexcept {
  return reinterpret_cast<std::uintptr_t>(pointer);
}

}  // namespace stowage
