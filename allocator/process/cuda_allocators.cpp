#include "allocator/process/cuda_allocators.hpp"

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "allocator/config.hpp"
#include "base/errors.hpp"
#include "device/cuda/cuda_backend.hpp"

namespace stowage::cuda_allocators {

namespace {

constexpr int kMaxDevices = 64;

// Heap-allocated and never freed (see the header).
struct Registry {
  std::mutex mutex;
  std::optional<std::string> config;  // normalised
  std::array<std::atomic<CachingAllocator*>, kMaxDevices> allocators{};
  std::vector<std::function<void(int, CachingAllocator&)>> listeners;
  std::atomic<int> made{0};
  std::atomic<CachingAllocator*> first{nullptr};  // the first one made
};

Registry& registry() {
  static auto* instance = new Registry();
  return *instance;
}

std::string normalise(const std::string& config) {
  return parse_allocator_config(config).to_string();
}

}  // namespace

void configure(const std::string& config) {
  Registry& r = registry();
  const std::string wanted = normalise(config);
  std::lock_guard lock(r.mutex);
  if (r.config.has_value()) {
    STOWAGE_CHECK(*r.config == wanted, "stowage's CUDA allocators are already configured with '",
                  *r.config, "' and in use; they cannot change to '", wanted,
                  "' in this process (set STOWAGE_ALLOC_CONF before the program starts)");
    return;
  }
  r.config = wanted;
}

bool configured() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return r.config.has_value();
}

std::string configuration() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return r.config.value_or(normalise(""));
}

CachingAllocator* find(int device) noexcept {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  return registry().allocators[static_cast<std::size_t>(device)].load(std::memory_order_acquire);
}

CachingAllocator& get(int device) {
  if (CachingAllocator* found = find(device)) return *found;
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  const int count = cuda_device_count();
  STOWAGE_CHECK(device >= 0 && device < count && device < kMaxDevices, "CUDA device ", device,
                " does not exist (this process sees ", count, ")");
  auto& slot = r.allocators[static_cast<std::size_t>(device)];
  if (CachingAllocator* made = slot.load(std::memory_order_acquire)) return *made;
  if (!r.config.has_value()) r.config = normalise("");
  auto backend = open_cuda_device(device);
  auto allocator = std::make_unique<CachingAllocator>(*backend, parse_allocator_config(*r.config));
  backend.release();  // owned by the allocator's lifetime, which is the process's
  CachingAllocator* made = allocator.release();
  // Observers, history and contexts are attached before any other thread can find it.
  for (const auto& listener : r.listeners) listener(device, *made);
  if (r.made.fetch_add(1, std::memory_order_acq_rel) == 0) {
    r.first.store(made, std::memory_order_release);
  }
  slot.store(made, std::memory_order_release);
  return *made;
}

CachingAllocator* sole() noexcept {
  Registry& r = registry();
  return r.made.load(std::memory_order_acquire) == 1 ? r.first.load(std::memory_order_acquire)
                                                      : nullptr;
}

CachingAllocator* owning(const void* ptr) {
  if (ptr == nullptr) return nullptr;
  for (int device = 0; device < kMaxDevices; ++device) {
    CachingAllocator* allocator = find(device);
    if (allocator != nullptr && allocator->block_size(ptr) != 0) return allocator;
  }
  return nullptr;
}

void for_each(const std::function<void(int, CachingAllocator&)>& fn) {
  for (int device = 0; device < kMaxDevices; ++device) {
    if (CachingAllocator* allocator = find(device)) fn(device, *allocator);
  }
}

void on_create(const std::function<void(int, CachingAllocator&)>& fn) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);  // no allocator can be made between the two steps
  r.listeners.push_back(fn);
  for_each(fn);
}

}  // namespace stowage::cuda_allocators
