// The cap on the memory an allocator may reserve from its device: the smallest of the device's
// capacity, a fraction of it and a byte limit. The fraction is the allocator's memory_fraction
// until torch's set_per_process_memory_fraction (set_fraction) replaces it; the cap counts
// reserved memory, as torch's fraction counts what its allocator took from cudaMalloc.
//
// Contract: plain values, not thread-safe (the allocator's lock guards it). Setters check their
// argument and throw LogicError naming it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <string>

#include "base/errors.hpp"

namespace stowage {

class MemoryLimit {
 public:
  MemoryLimit(std::size_t device_bytes, std::size_t limit_bytes, double fraction)
      : device_bytes_(device_bytes) {
    set_bytes(limit_bytes);
    set_fraction(fraction);
    configured_fraction_ = fraction;
  }

  // 0 <= fraction <= 1; 0 refuses every request that needs new memory, as torch allows.
  void set_fraction(double fraction) {
    STOWAGE_CHECK(fraction >= 0 && fraction <= 1, "memory fraction must be in [0, 1], not ",
                  fraction);
    fraction_ = fraction;
  }
  void set_bytes(std::size_t bytes) {
    STOWAGE_CHECK(bytes > 0, "the memory limit must be positive");
    limit_bytes_ = bytes;
  }
  double fraction() const noexcept { return fraction_; }

  // The cap in force.
  std::size_t bytes() const noexcept {
    const auto by_fraction =
        static_cast<std::size_t>(std::floor(fraction_ * static_cast<double>(device_bytes_)));
    return std::min({device_bytes_, by_fraction, limit_bytes_});
  }
  // Whether `reserved` bytes may grow by `more`.
  bool allows(std::size_t reserved, std::size_t more) const noexcept {
    const std::size_t cap = bytes();
    return more <= cap && reserved <= cap - more;
  }
  // What `reserved` bytes may still grow by (0 when at or over the cap).
  std::size_t room(std::size_t reserved) const noexcept {
    const std::size_t cap = bytes();
    return reserved < cap ? cap - reserved : 0;
  }
  // Which setting the cap in force comes from, as messages name it: "the device's memory", "the
  // allocator's limit", "the allocator's memory_fraction (0.50)" or "torch's per-process memory
  // fraction (0.50)" (set_fraction after construction). The device wins ties, then the limit.
  std::string bound_name() const {
    const std::size_t cap = bytes();
    if (cap == device_bytes_) return "the device's memory";
    if (cap == limit_bytes_) return "the allocator's limit";
    char value[32];
    std::snprintf(value, sizeof(value), "%.2f", fraction_);
    return fraction_ == configured_fraction_
               ? "the allocator's memory_fraction (" + std::string(value) + ")"
               : "torch's per-process memory fraction (" + std::string(value) + ")";
  }

 private:
  std::size_t device_bytes_;
  std::size_t limit_bytes_ = 0;
  double fraction_ = 1;
  double configured_fraction_ = 1;  // the fraction the allocator was made with
};

}  // namespace stowage
