// The C interface of c_api.h over the process's CUDA allocators (cuda_allocators.hpp).
#include "allocator/process/c_api.h"

#include <cstdlib>
#include <exception>
#include <string>

#include "allocator/process/cuda_allocators.hpp"
#include "base/errors.hpp"

namespace {

thread_local std::string last_error;

stowage::Stream to_stream(void* stream) {
  return stowage::Stream{reinterpret_cast<std::uintptr_t>(stream)};
}

// The first use without stowage_configure() takes STOWAGE_ALLOC_CONF.
stowage::CachingAllocator& allocator_of(int device) {
  if (stowage::cuda_allocators::find(device) == nullptr && !stowage::cuda_allocators::configured()) {
    if (const char* conf = std::getenv("STOWAGE_ALLOC_CONF")) {
      try {
        stowage::cuda_allocators::configure(conf);
      } catch (const stowage::LogicError&) {
        // Another thread configured it first; its configuration stands.
        if (!stowage::cuda_allocators::configured()) throw;
      }
    }
  }
  return stowage::cuda_allocators::get(device);
}

template <typename Fn>
bool guarded(Fn&& fn) noexcept {
  last_error.clear();
  try {
    fn();
    return true;
  } catch (const std::exception& error) {
    last_error = error.what();
  } catch (...) {
    last_error = "unknown error";
  }
  return false;
}

}  // namespace

extern "C" {

void* stowage_malloc(size_t size, int device, void* stream) {
  void* ptr = nullptr;
  guarded([&] { ptr = allocator_of(device).malloc(size, to_stream(stream)); });
  return ptr;
}

void stowage_free(void* ptr, size_t size, int device, void* /*stream*/) {
  guarded([&] {
    if (ptr == nullptr) return;
    stowage::CachingAllocator* allocator = stowage::cuda_allocators::find(device);
    STOWAGE_CHECK(allocator != nullptr, "stowage_free(", ptr, ") on device ", device,
                  ", where stowage allocated nothing");
    if (size == 0) {
      allocator->free(ptr);
    } else {
      allocator->free(ptr, size);
    }
  });
}

void stowage_init(int /*device_count*/) {}

void stowage_reset(void) {
  guarded([] {
    stowage::cuda_allocators::for_each(
        [](int, stowage::CachingAllocator& allocator) { allocator.empty_cache(); });
  });
}

void stowage_set_memory_fraction(double fraction, int device) {
  guarded([&] { allocator_of(device).set_memory_fraction(fraction); });
}

void stowage_record_stream(void* ptr, void* stream) {
  guarded([&] {
    if (stowage::CachingAllocator* owner = stowage::cuda_allocators::owning(ptr)) {
      owner->record_stream(ptr, to_stream(stream));
    }
  });
}

void* stowage_base_alloc(void* ptr, size_t* size) {
  void* base = nullptr;
  guarded([&] {
    if (stowage::CachingAllocator* owner = stowage::cuda_allocators::owning(ptr)) {
      const auto [start, bytes] = owner->base_allocation(ptr);
      base = start;
      if (size != nullptr) *size = bytes;
    }
  });
  return base;
}

int stowage_configure(const char* config) {
  return guarded([&] { stowage::cuda_allocators::configure(config == nullptr ? "" : config); })
             ? 0
             : 1;
}

const char* stowage_last_error(void) { return last_error.c_str(); }

}  // extern "C"
