#include "device/host/host_backend.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <bit>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <thread>

#include "base/bounded_wait.hpp"
#include "base/errors.hpp"
#include "device/host/host_pages.hpp"

namespace stowage {

namespace {

// Mappings left to the rest of the process (libraries, Python, torch) below vm.max_map_count.
constexpr std::size_t kMappingsLeftToProcess = 16384;
constexpr std::size_t kMinimumMappings = 1024;

std::size_t kernel_max_map_count() {
  std::ifstream file("/proc/sys/vm/max_map_count");
  std::size_t value = 0;
  if (file >> value) return value;
  return 65530;  // the kernel's default
}

std::size_t default_max_mappings() {
  const std::size_t limit = kernel_max_map_count();
  return limit > kMappingsLeftToProcess + kMinimumMappings ? limit - kMappingsLeftToProcess
                                                           : kMinimumMappings;
}

void* map_anonymous(std::size_t bytes) {
  void* ptr = ::mmap(nullptr, round_up(bytes, host_page_size()), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return ptr == MAP_FAILED ? nullptr : ptr;
}

}  // namespace

// Checked before any member is built from the options.
HostBackendOptions HostBackend::validated(HostBackendOptions options) {
  STOWAGE_CHECK(options.capacity_bytes > 0 && options.capacity_bytes <= kMaxCapacity,
                "a simulated device's capacity must be between 1 byte and ", kMaxCapacity,
                " bytes, not ", options.capacity_bytes);
  STOWAGE_CHECK(std::has_single_bit(options.granularity) && options.granularity % host_page_size() == 0,
                "the granularity must be a power of two and a multiple of the host page size (",
                host_page_size(), "), not ", options.granularity);
  // NaN fails both comparisons. Below the floor, a wait for a copy could pass its deadline on a
  // device that is not stuck (Note [Bounded waits]).
  STOWAGE_CHECK(options.copy_bytes_per_second == 0 ||
                    (options.copy_bytes_per_second >= kFloorBytesPerSecond &&
                     options.copy_bytes_per_second <= kMaxCopyBytesPerSecond),
                "a simulated link's bandwidth must be 0 (as fast as memory copies) or from ",
                kFloorBytesPerSecond / 1e6, " MB/s to ", kMaxCopyBytesPerSecond / 1e12, " TB/s, not ",
                options.copy_bytes_per_second, " bytes/s");
  return options;
}

HostBackend::HostBackend(HostBackendOptions options)
    : options_(validated(options)),
      max_mappings_(options_.max_mappings != 0 ? options_.max_mappings : default_max_mappings()),
      segment_memory_(options_.capacity_bytes, options_.release_freed_memory),
      virtual_memory_(options_.capacity_bytes, options_.granularity, options_.release_freed_memory,
                      options_.back_mappings),
      streams_(options_.synchronous) {
  properties_.name = "stowage simulated device (HostBackend)";
  properties_.device_index = options_.device_index;
  properties_.total_bytes = options_.capacity_bytes;
  properties_.virtual_memory = true;
  properties_.granularity = options_.granularity;
  properties_.simulated = true;
}

HostBackend::~HostBackend() {
  streams_.synchronize_all();
  for (const auto& [base, bytes] : pinned_) {
    ::munmap(reinterpret_cast<void*>(base), round_up(bytes, host_page_size()));
  }
}

bool HostBackend::count_call(BackendCall call, std::uint64_t* call_number) {
  if (const std::uint64_t cost = options_.call_costs.of(call); cost != 0) {
    charged_ns_.fetch_add(cost, std::memory_order_relaxed);
  }
  return faults_.should_fail(call, call_number);
}

void HostBackend::fail_if_injected(BackendCall call) {
  std::uint64_t call_number = 0;
  if (count_call(call, &call_number)) {
    STOWAGE_THROW(BackendError, "injected fault in ", backend_call_name(call), " (call #",
                  call_number, ")");
  }
}

MemoryInfo HostBackend::memory_info() {
  std::lock_guard lock(memory_mutex_);
  return {options_.capacity_bytes - used_bytes_locked(), options_.capacity_bytes};
}

std::size_t HostBackend::used_bytes_locked() const {
  return segment_bytes_ + virtual_memory_.physical_bytes();
}

std::size_t HostBackend::used_bytes() const {
  std::lock_guard lock(memory_mutex_);
  return used_bytes_locked();
}

std::size_t HostBackend::pinned_bytes() const {
  std::lock_guard lock(memory_mutex_);
  return pinned_bytes_;
}

std::size_t HostBackend::kernel_mappings_locked() const {
  return 1 + segment_memory_.overflow_count() + pinned_.size() +
         virtual_memory_.reservation_count() +
         2 * virtual_memory_.kernel_mapping_count();
}

std::size_t HostBackend::kernel_mappings() const {
  std::lock_guard lock(memory_mutex_);
  return kernel_mappings_locked();
}

void HostBackend::check_mapping_room_locked(std::size_t added) const {
  const std::size_t held = kernel_mappings_locked();
  if (held + added > max_mappings_) {
    STOWAGE_THROW(BackendError, "the simulated device holds ", held,
                  " kernel mappings and may hold at most ", max_mappings_,
                  " (vm.max_map_count is ", kernel_max_map_count(),
                  "): use fewer, larger chunks, or raise max_mappings and vm.max_map_count");
  }
}

// --- segments ---

void* HostBackend::try_allocate_segment(std::size_t bytes) {
  STOWAGE_CHECK(bytes > 0, "cannot allocate an empty segment");
  if (count_call(BackendCall::kAllocateSegment)) return nullptr;
  std::lock_guard lock(memory_mutex_);
  if (bytes > options_.capacity_bytes - used_bytes_locked()) return nullptr;
  void* ptr = segment_memory_.try_allocate(bytes);
  if (ptr == nullptr) return nullptr;  // the host is out of address space: out of memory too
  segments_.emplace(to_address(ptr), bytes);
  segment_bytes_ += bytes;
  return ptr;
}

void HostBackend::free_segment(void* ptr) {
  free_live(BackendCall::kFreeSegment, segments_, ptr, "segment of this device",
            [&](std::size_t bytes) {
              segment_memory_.free(ptr, bytes);
              segment_bytes_ -= bytes;
            });
}

template <typename Release>
void HostBackend::free_live(BackendCall call, std::map<std::uintptr_t, std::size_t>& live,
                            void* ptr, const char* what, Release release) {
  fail_if_injected(call);
  // cudaFree and cudaFreeHost wait for the device: work still queued on the memory finishes
  // first.
  streams_.synchronize_all();
  std::lock_guard lock(memory_mutex_);
  const auto it = live.find(to_address(ptr));
  STOWAGE_CHECK(it != live.end(), "free of ", ptr, ", which is not a live ", what);
  release(it->second);
  live.erase(it);
}

// --- virtual memory ---

void* HostBackend::reserve_address_range(std::size_t bytes, std::size_t alignment) {
  fail_if_injected(BackendCall::kReserve);
  std::lock_guard lock(memory_mutex_);
  check_mapping_room_locked(1);
  return virtual_memory_.reserve(bytes, alignment);
}

void HostBackend::release_address_range(void* base, std::size_t bytes) {
  fail_if_injected(BackendCall::kReleaseReservation);
  std::lock_guard lock(memory_mutex_);
  virtual_memory_.release_reservation(base, bytes);
}

std::optional<PhysicalHandle> HostBackend::try_create_physical(std::size_t bytes) {
  if (count_call(BackendCall::kCreatePhysical)) return std::nullopt;
  std::lock_guard lock(memory_mutex_);
  if (bytes > options_.capacity_bytes - used_bytes_locked()) return std::nullopt;
  return virtual_memory_.try_create(bytes);
}

void HostBackend::release_physical(PhysicalHandle handle) {
  fail_if_injected(BackendCall::kReleasePhysical);
  std::lock_guard lock(memory_mutex_);
  virtual_memory_.release(handle);
}

void HostBackend::map(void* address, std::size_t bytes, PhysicalHandle handle,
                      std::size_t handle_offset) {
  fail_if_injected(BackendCall::kMap);
  std::lock_guard lock(memory_mutex_);
  check_mapping_room_locked(2);
  virtual_memory_.map(address, bytes, handle, handle_offset);
}

void HostBackend::set_access(void* address, std::size_t bytes) {
  fail_if_injected(BackendCall::kSetAccess);
  std::lock_guard lock(memory_mutex_);
  virtual_memory_.set_access(address, bytes);
}

void HostBackend::unmap(void* address, std::size_t bytes) {
  fail_if_injected(BackendCall::kUnmap);
  std::lock_guard lock(memory_mutex_);
  virtual_memory_.unmap(address, bytes);
}

// --- streams and events ---

Stream HostBackend::create_stream() {
  fail_if_injected(BackendCall::kCreateStream);
  return streams_.create_stream();
}

void HostBackend::destroy_stream(Stream stream) { streams_.destroy_stream(stream); }
void HostBackend::synchronize_stream(Stream stream) {
  fail_if_injected(BackendCall::kSynchronize);
  streams_.synchronize_stream(stream);
}

void HostBackend::synchronize_device() {
  fail_if_injected(BackendCall::kSynchronize);
  streams_.synchronize_all();
}

Event HostBackend::create_event() {
  fail_if_injected(BackendCall::kCreateEvent);
  return streams_.create_event();
}

void HostBackend::destroy_event(Event event) { streams_.destroy_event(event); }

void HostBackend::record_event(Event event, Stream stream) {
  fail_if_injected(BackendCall::kRecordEvent);
  streams_.record_event(event, stream);
}

bool HostBackend::query_event(Event event) { return streams_.query_event(event); }
void HostBackend::synchronize_event(Event event) {
  fail_if_injected(BackendCall::kSynchronize);
  streams_.synchronize_event(event);
}

void HostBackend::stream_wait_event(Stream stream, Event event) {
  streams_.stream_wait_event(stream, event);
}

Event HostBackend::create_timing_event() {
  fail_if_injected(BackendCall::kCreateEvent);
  return streams_.create_event(/*timing=*/true);
}

double HostBackend::elapsed_seconds(Event start, Event end) {
  return streams_.elapsed_seconds(start, end);
}

void HostBackend::prepare_fork() {
  streams_.prepare_fork();
  memory_mutex_.lock();
}

void HostBackend::after_fork() {
  memory_mutex_.unlock();
  streams_.after_fork();
}

// --- work on streams ---

void HostBackend::check_range_locked(const void* ptr, std::size_t bytes, const char* what) const {
  const std::uintptr_t address = to_address(ptr);
  STOWAGE_CHECK(ptr != nullptr, what, " is a null pointer");
  STOWAGE_CHECK(bytes <= std::numeric_limits<std::uintptr_t>::max() - address, what, " of ",
                bytes, " bytes at ", ptr, " runs past the end of memory");
  const std::uintptr_t end = address + bytes;
  // The device or pinned allocation holding `address`, if any, must hold the whole range.
  for (const auto* allocations : {&segments_, &pinned_}) {
    auto it = allocations->upper_bound(address);
    if (it != allocations->begin()) {
      const auto holder = std::prev(it);
      if (address < holder->first + holder->second) {
        STOWAGE_CHECK(bytes <= holder->first + holder->second - address, what, " of ", bytes,
                      " bytes at ", ptr, " runs past the end of its ",
                      allocations == &segments_ ? "segment" : "pinned buffer");
        return;
      }
    }
    // Host memory must not run into an allocation either.
    STOWAGE_CHECK(it == allocations->end() || it->first >= end, what, " of ", bytes, " bytes at ",
                  ptr, " runs into device or pinned memory it does not belong to");
  }
  if (virtual_memory_.reserved(ptr)) {
    virtual_memory_.check_accessible(ptr, bytes);
    STOWAGE_CHECK(options_.back_mappings, what, " of mapped memory at ", ptr,
                  ": this simulated device does not back its mappings (back_mappings is off)");
    return;
  }
  STOWAGE_CHECK(!virtual_memory_.reserved(reinterpret_cast<const void*>(end - 1)), what, " of ",
                bytes, " bytes at ", ptr, " runs into reserved device address space");
  // Anything else is host memory, which copies may read and write as under UVA.
}

void HostBackend::copy_async(void* dst, const void* src, std::size_t bytes, Stream stream) {
  std::uint64_t call_number = 0;
  if (count_call(BackendCall::kCopy, &call_number)) {
    STOWAGE_THROW(BackendError, "injected fault in copy_async (call #", call_number, ")");
  }
  const bool corrupt = faults_.should_corrupt(BackendCall::kCopy, call_number);
  if (bytes == 0) return;
  {
    std::lock_guard lock(memory_mutex_);
    check_range_locked(dst, bytes, "copy destination");
    check_range_locked(src, bytes, "copy source");
  }
  const double bandwidth = options_.copy_bytes_per_second;
  streams_.enqueue(stream, [dst, src, bytes, bandwidth, corrupt] {
    const auto start = std::chrono::steady_clock::now();
    std::memcpy(dst, src, bytes);
    if (corrupt) static_cast<unsigned char*>(dst)[bytes / 2] ^= 0x10;  // an injected silent fault
    if (bandwidth > 0) {
      const std::chrono::duration<double> duration(static_cast<double>(bytes) / bandwidth);
      std::this_thread::sleep_until(start + std::chrono::duration_cast<
                                                std::chrono::steady_clock::duration>(duration));
    }
  });
}

void HostBackend::memset_async(void* dst, int value, std::size_t bytes, Stream stream) {
  fail_if_injected(BackendCall::kMemset);
  if (bytes == 0) return;
  {
    std::lock_guard lock(memory_mutex_);
    check_range_locked(dst, bytes, "memset destination");
  }
  streams_.enqueue(stream, [dst, value, bytes] { std::memset(dst, value, bytes); });
}

void HostBackend::enqueue_host_function(Stream stream, std::function<void()> fn) {
  STOWAGE_CHECK(static_cast<bool>(fn), "enqueue_host_function needs a function");
  streams_.enqueue(stream, std::move(fn));
}

// --- pinned host memory ---

void* HostBackend::try_allocate_pinned(std::size_t bytes) {
  STOWAGE_CHECK(bytes > 0, "cannot allocate an empty pinned buffer");
  if (count_call(BackendCall::kAllocatePinned)) return nullptr;
  std::lock_guard lock(memory_mutex_);
  if (options_.pinned_capacity_bytes != 0 &&
      bytes > options_.pinned_capacity_bytes - std::min(options_.pinned_capacity_bytes,
                                                        pinned_bytes_)) {
    return nullptr;
  }
  check_mapping_room_locked(1);
  void* ptr = map_anonymous(bytes);
  if (ptr == nullptr) return nullptr;
  pinned_.emplace(to_address(ptr), bytes);
  pinned_bytes_ += bytes;
  return ptr;
}

namespace {

// Gives every page of the range its memory now, as pinning does (cudaHostRegister locks each
// page), so copies into it later do not stop on page faults.
void populate(void* ptr, std::size_t bytes) {
#ifdef MADV_POPULATE_WRITE
  if (::madvise(ptr, bytes, MADV_POPULATE_WRITE) == 0) return;
#endif
  auto* bytes_of = static_cast<volatile char*>(ptr);
  for (std::size_t offset = 0; offset < bytes; offset += host_page_size()) {
    bytes_of[offset] = bytes_of[offset];
  }
}

}  // namespace

bool HostBackend::try_register_host(void* ptr, std::size_t bytes) {
  STOWAGE_CHECK(ptr != nullptr && bytes > 0, "register_host needs memory to pin");
  STOWAGE_CHECK(to_address(ptr) % host_page_size() == 0 && bytes % host_page_size() == 0,
                "register_host takes whole host pages, not ", bytes, " bytes at ", ptr);
  if (count_call(BackendCall::kRegisterHost)) return false;
  std::lock_guard lock(memory_mutex_);
  const auto after = registered_.lower_bound(to_address(ptr));
  const bool overlaps =
      (after != registered_.end() && after->first < to_address(ptr) + bytes) ||
      (after != registered_.begin() && std::prev(after)->first + std::prev(after)->second >
                                           to_address(ptr));
  STOWAGE_CHECK(!overlaps, "host memory at ", ptr, " is pinned already");
  if (options_.pinned_capacity_bytes != 0 &&
      bytes > options_.pinned_capacity_bytes - std::min(options_.pinned_capacity_bytes,
                                                        pinned_bytes_)) {
    return false;
  }
  registered_.emplace(to_address(ptr), bytes);
  pinned_bytes_ += bytes;
  populate(ptr, bytes);
  return true;
}

void HostBackend::unregister_host(void* ptr) {
  fail_if_injected(BackendCall::kUnregisterHost);
  std::lock_guard lock(memory_mutex_);
  const auto it = registered_.find(to_address(ptr));
  STOWAGE_CHECK(it != registered_.end(), "unregister_host of ", ptr,
                ", which register_host did not pin");
  pinned_bytes_ -= it->second;
  registered_.erase(it);
}

void HostBackend::free_pinned(void* ptr) {
  free_live(BackendCall::kFreePinned, pinned_, ptr, "pinned buffer", [&](std::size_t bytes) {
    ::munmap(ptr, round_up(bytes, host_page_size()));
    pinned_bytes_ -= bytes;
  });
}

void HostBackend::check_invariants() const {
  std::lock_guard lock(memory_mutex_);
  virtual_memory_.check_invariants();
  segment_memory_.check_invariants();
  std::size_t segment_bytes = 0;
  std::uintptr_t previous_end = 0;
  for (const auto& [base, bytes] : segments_) {
    STOWAGE_INTERNAL_ASSERT(base >= previous_end, "segments overlap at ", base);
    previous_end = base + bytes;
    segment_bytes += bytes;
  }
  STOWAGE_INTERNAL_ASSERT(segment_bytes == segment_bytes_);
  std::size_t pinned_bytes = 0;
  for (const auto& [base, bytes] : pinned_) pinned_bytes += bytes;
  for (const auto& [base, bytes] : registered_) pinned_bytes += bytes;
  STOWAGE_INTERNAL_ASSERT(pinned_bytes == pinned_bytes_);
  STOWAGE_INTERNAL_ASSERT(used_bytes_locked() <= options_.capacity_bytes, "device uses ",
                          used_bytes_locked(), " bytes of a capacity of ",
                          options_.capacity_bytes);
  STOWAGE_INTERNAL_ASSERT(kernel_mappings_locked() <= max_mappings_);
}

}  // namespace stowage
