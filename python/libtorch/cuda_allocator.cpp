// stowage as torch's CUDA allocator (cuda_allocator.hpp).
//
// Everything that depends on torch's version lives in this file: the CUDAAllocator interface
// this class overrides, and torch's structures for stats, snapshots and trace entries. torch
// changes them between releases; the check below names the versions this file was written and
// tested against, and the build compiles it only for those (cmake/StowageDependencies.cmake).
#include "python/libtorch/cuda_allocator.hpp"

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <torch/headeronly/version.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_set>
#include <vector>

#include "allocator/process/cuda_allocators.hpp"
#include "base/errors.hpp"
#include "python/libtorch/gathered_contexts.hpp"
#include "python/libtorch/uncached_allocations.hpp"

#if !(TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR == 11)
#error "stowage's torch CUDA allocator supports torch 2.11; use the C library (stowage_malloc) with other versions"
#endif

namespace stowage::torch_cuda {

namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
namespace cda = c10::CachingDeviceAllocator;
using PluggableBase = torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

Stream to_stream(cudaStream_t stream) { return Stream{reinterpret_cast<std::uintptr_t>(stream)}; }
void* to_cuda_stream(Stream stream) { return reinterpret_cast<void*>(stream.handle); }

CachingAllocator& allocator_of(c10::DeviceIndex device) { return cuda_allocators::get(device); }

// For questions that must not open a device (a CUDA context costs hundreds of MiB): the device's
// allocator only when one exists already.
CachingAllocator* existing(c10::DeviceIndex device) { return cuda_allocators::find(device); }

// torch.profiler(profile_memory=True) hears of each allocation and free as from torch's
// allocator: the block's bytes (negative for a free) and the device's allocated and reserved
// bytes after it. Asked only while the calling thread profiles memory.
void report_to_profiler(const CachingAllocator& allocator, int device, void* ptr, std::int64_t bytes) {
  const DeviceStats stats = allocator.stats();
  c10::reportMemoryUsageToProfiler(ptr, bytes, static_cast<std::size_t>(stats.allocated_bytes.all().current),
                                   static_cast<std::size_t>(stats.reserved_bytes.all().current),
                                   c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
}

// A free while the thread profiles memory: the owner found by asking each device. False when no
// allocator holds `ptr` (nothing freed).
bool delete_block_profiled(void* ptr) {
  bool found = false;
  cuda_allocators::for_each([ptr, &found](int device, CachingAllocator& allocator) {
    const std::size_t bytes = found ? 0 : allocator.block_size(ptr);
    if (bytes == 0) return;
    found = true;
    allocator.free(ptr);
    report_to_profiler(allocator, device, ptr, -static_cast<std::int64_t>(bytes));
  });
  return found;
}

// torch's own allocator refuses a request of 1 EB or more before trying, with these words.
constexpr std::size_t kOneExaByte = std::size_t{1} << 60;

// Frees a block of any device. One device is the common case: its allocator frees directly (and
// logs a pointer it does not know); with several, each is asked in turn.
void delete_block(void* ptr) {
  if (ptr == nullptr) return;
  if (c10::memoryProfilingEnabled() && delete_block_profiled(ptr)) return;
  if (CachingAllocator* only = cuda_allocators::sole()) {
    only->free(ptr);
    return;
  }
  if (CachingAllocator* owner = cuda_allocators::owning(ptr)) {
    owner->free(ptr);
  } else if (CachingAllocator* any = cuda_allocators::find(0)) {
    any->free(ptr);  // counted and logged as an invalid free
  }
}

// Whether a trace event keeps its stack under torch's record mode (_record_memory_history's
// context): "all" every event's, "alloc" the allocating side's (torch records the stack in
// malloc), "state" none (only live blocks keep theirs).
bool trace_keeps_context(cca::RecordContext when, TraceAction action) {
  if (when == cca::RecordContext::ALL) return true;
  if (when != cca::RecordContext::ALLOC) return false;
  return action == TraceAction::kAlloc || action == TraceAction::kSegmentAlloc ||
         action == TraceAction::kSegmentMap || action == TraceAction::kOom;
}

// torch's _set_memory_metadata, per device: from which history position (History::recorded())
// each metadata string was in force, oldest first.
using MetadataMarks = std::vector<std::pair<std::uint64_t, std::string>>;

// The metadata in force at history position `at`.
const std::string& metadata_at(const MetadataMarks& marks, std::uint64_t at) {
  static const std::string none;
  const auto after = std::upper_bound(marks.begin(), marks.end(), at,
                                      [](std::uint64_t p, const auto& mark) { return p < mark.first; });
  return after == marks.begin() ? none : std::prev(after)->second;
}

// What is allocated while torch's caching is off (torch.cuda.caching_allocator_enable(False)).
UncachedAllocations& uncached() {
  static auto* instance = new UncachedAllocations();  // never destroyed, as the allocators
  return *instance;
}

// The deleter of memory allocated while caching was off (and, as torch's raw_deleter() then, of
// any: a cached block handed here goes back to the cache). Never throws: torch frees from
// destructors.
void delete_uncached(void* ptr) {
  if (ptr == nullptr) return;
  try {
    if (uncached().free(ptr)) return;
  } catch (const std::exception& error) {
    TORCH_WARN("stowage: freeing ", ptr, ", allocated while caching was off, failed: ", error.what());
    return;
  }
  delete_block(ptr);
}

// History events carry microseconds since the epoch; torch's snapshots carry its approximate
// clock (TSC ticks where available) and convert back with ApproximateClockToUnixTimeConverter.
// This maps one to the other through two readings of both clocks taken far apart.
class ClockMapping {
 public:
  ClockMapping() : start_(c10::ApproximateClockToUnixTimeConverter::measurePair()) {}
  // A converter for one snapshot: both clocks are read once, when it is made.
  std::function<c10::approx_time_t(std::int64_t)> converter() const {
    const auto now = c10::ApproximateClockToUnixTimeConverter::measurePair();
    const double elapsed_ns = static_cast<double>(now.t_ - start_.t_);
    double ticks_per_ns = 1.0;
    if constexpr (!std::is_same_v<c10::approx_time_t, std::int64_t>) {
      if (elapsed_ns > 1e6) {
        ticks_per_ns = static_cast<double>(now.approx_t_ - start_.approx_t_) / elapsed_ns;
      }
    }
    return [now, ticks_per_ns](std::int64_t time_us) {
      const double ns = static_cast<double>(time_us) * 1000.0;
      const double ticks =
          static_cast<double>(now.approx_t_) - (static_cast<double>(now.t_) - ns) * ticks_per_ns;
      return static_cast<c10::approx_time_t>(std::max(ticks, 0.0));
    };
  }

 private:
  c10::ApproximateClockToUnixTimeConverter::UnixAndApproximateTimePair start_;
};

cda::TraceEntry::Action to_torch(TraceAction action) {
  switch (action) {
    case TraceAction::kAlloc: return cda::TraceEntry::ALLOC;
    case TraceAction::kFreeRequested: return cda::TraceEntry::FREE_REQUESTED;
    case TraceAction::kFreeCompleted: return cda::TraceEntry::FREE_COMPLETED;
    case TraceAction::kSegmentAlloc: return cda::TraceEntry::SEGMENT_ALLOC;
    case TraceAction::kSegmentFree: return cda::TraceEntry::SEGMENT_FREE;
    case TraceAction::kSegmentMap: return cda::TraceEntry::SEGMENT_MAP;
    case TraceAction::kSegmentUnmap: return cda::TraceEntry::SEGMENT_UNMAP;
    case TraceAction::kSnapshot: return cda::TraceEntry::SNAPSHOT;
    case TraceAction::kOom: return cda::TraceEntry::OOM;
    case TraceAction::kMarkStep: return cda::TraceEntry::SNAPSHOT;
    case TraceAction::kFitTrialBegin: return cda::TraceEntry::SNAPSHOT;
    case TraceAction::kFitTrialEnd: return cda::TraceEntry::SNAPSHOT;
  }
  return cda::TraceEntry::ALLOC;
}

void copy_stats(const SizeClassStats& from, c10::CachingAllocator::StatArray& to) {
  for (std::size_t i = 0; i < to.size(); ++i) {
    to[i].current = from.stats[i].current;
    to[i].peak = from.stats[i].peak;
    to[i].allocated = from.stats[i].allocated;
    to[i].freed = from.stats[i].freed;
  }
}

void copy_stat(const Stat& from, c10::CachingAllocator::Stat& to) {
  to.current = from.current;
  to.peak = from.peak;
  to.allocated = from.allocated;
  to.freed = from.freed;
}

cda::DeviceStats to_torch(const DeviceStats& s) {
  cda::DeviceStats out;
  copy_stats(s.allocation, out.allocation);
  copy_stats(s.segment, out.segment);
  copy_stats(s.active, out.active);
  copy_stats(s.inactive_split, out.inactive_split);
  copy_stats(s.allocated_bytes, out.allocated_bytes);
  copy_stats(s.reserved_bytes, out.reserved_bytes);
  copy_stats(s.active_bytes, out.active_bytes);
  copy_stats(s.inactive_split_bytes, out.inactive_split_bytes);
  copy_stats(s.requested_bytes, out.requested_bytes);
  out.num_alloc_retries = s.num_alloc_retries;
  out.num_ooms = s.num_ooms;
  copy_stat(s.oversize_allocations, out.oversize_allocations);
  copy_stat(s.oversize_segments, out.oversize_segments);
  out.num_sync_all_streams = s.num_sync_all_streams;
  out.num_device_alloc = s.num_device_alloc;
  out.num_device_free = s.num_device_free;
  out.max_split_size = s.max_split_size;
  return out;
}

// A pool's layout for torch's cudagraph trees (getCheckpointState / setCheckpointPoolState).
struct PoolState final : cca::AllocatorState {
  PoolState(c10::DeviceIndex d, PoolCheckpoint c) : device(d), checkpoint(std::move(c)) {}
  c10::DeviceIndex device;
  PoolCheckpoint checkpoint;
};

// torch's CUDAAllocator over the process's CachingAllocators (one per device, from
// cuda_allocators.hpp). It owns nothing of the memory; it keeps torch's observers, trace trackers,
// history settings and gathered contexts, guarded by mutex_ (the flags read on the hot path are
// atomics). Thread-safe; one instance per process, installed once and never destroyed.
class StowageCudaAllocator final : public PluggableBase {
 public:
  StowageCudaAllocator()
      : PluggableBase(
            [](std::size_t size, int device, cudaStream_t stream) {
              return allocator_of(static_cast<c10::DeviceIndex>(device))
                  .malloc(size, to_stream(stream));
            },
            [](void* ptr, std::size_t, int, cudaStream_t) { delete_block(ptr); }) {
    // Every allocator, present or future, reports to torch's observers and trackers and tags
    // its history with torch's contexts.
    cuda_allocators::on_create([this](int device, CachingAllocator& allocator) {
      // As torch calls them: the size it tried to allocate, and the memory allowed (the cap).
      allocator.add_oom_observer([this, device](const OomReport& report) {
        std::vector<cca::OutOfMemoryObserver> observers;
        {
          std::lock_guard lock(mutex_);
          observers = oom_observers_;
        }
        for (const auto& observer : observers) {
          observer(device, report.rounded, report.limit, report.device_free);
        }
      });
      allocator.set_context_provider([this] { return gather_context(); });
      const std::uint64_t at = allocator.history_recorded();
      std::lock_guard lock(mutex_);
      metadata_marks_[device] = {{at, user_metadata_}};
    });
  }

  // --- allocation ---

  c10::DataPtr allocate(std::size_t size) override {
    TORCH_CHECK_WITH(OutOfMemoryError, size < kOneExaByte,
                     "CUDA out of memory. Tried to allocate more than 1EB memory.");
    const c10::DeviceIndex device = c10::cuda::current_device();
    const c10::Device where(c10::DeviceType::CUDA, device);
    if (!caching()) {
      void* ptr = malloc_uncached(size, device);
      return {ptr, ptr, &delete_uncached, where};
    }
    void* ptr = malloc_on(size, device, c10::cuda::getCurrentCUDAStream(device).stream());
    return {ptr, ptr, &delete_block, where};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return caching() ? &delete_block : &delete_uncached;
  }
  void* raw_alloc(std::size_t nbytes) override {
    const c10::DeviceIndex device = c10::cuda::current_device();
    if (!caching()) return malloc_uncached(nbytes, device);
    return malloc_on(nbytes, device, c10::cuda::getCurrentCUDAStream(device).stream());
  }
  void* raw_alloc_with_stream(std::size_t nbytes, cudaStream_t stream) override {
    if (!caching()) return malloc_uncached(nbytes, c10::cuda::current_device());
    return malloc_on(nbytes, c10::cuda::current_device(), stream);
  }
  void raw_delete(void* ptr) override {
    if (!uncached().empty()) {
      delete_uncached(ptr);
    } else {
      delete_block(ptr);
    }
  }

  // torch's lazy initialisation, the first time the program uses CUDA (Note [No CUDA before the
  // program's]): each device's allocator is made at its first allocation, so nothing opens a
  // device here. torch parses PYTORCH_CUDA_ALLOC_CONF as CUDA starts (a bad value raises here, as
  // under torch's allocator); its per_process_memory_fraction caps every device's allocator as
  // set_per_process_memory_fraction would, those made later too.
  void init(int /*device_count*/) override {
    const double fraction = cca::CUDAAllocatorConfig::per_process_memory_fraction();
    if (initialized_flag_.exchange(true) || fraction == 1.0) return;
    cuda_allocators::on_create([fraction](int, CachingAllocator& allocator) { allocator.set_memory_fraction(fraction); });
  }
  bool initialized() override { return initialized_flag_.load(); }

  // torch.cuda.caching_allocator_enable: off, every allocation is the device's own and goes back
  // when freed, counted in no statistic (uncached_allocations.hpp), as with torch's allocator.
  void enable(bool value) override { caching_.store(value, std::memory_order_relaxed); }
  bool isEnabled() const override { return caching(); }

  // --- limits and cache ---

  double getMemoryFraction(c10::DeviceIndex device) override {
    return allocator_of(device).memory_fraction();
  }
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    TORCH_CHECK(fraction >= 0 && fraction <= 1, "memory fraction must be in [0, 1], not ",
                fraction);
    allocator_of(device).set_memory_fraction(fraction);
  }
  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex device) override {
    std::map<std::pair<void*, bool>, std::size_t> sizes;
    CachingAllocator* allocator = existing(device);
    if (allocator == nullptr) return {};
    for (const SegmentSnapshot& segment : allocator->snapshot().segments) {
      if (!segment.is_expandable) continue;
      sizes[{to_cuda_stream(segment.stream), segment.size_class == SizeClass::kSmall}] += segment.total_size;
    }
    std::vector<cca::StreamSegmentSize> out;
    for (const auto& [key, bytes] : sizes) {
      out.emplace_back(static_cast<cudaStream_t>(key.first), key.second, bytes);
    }
    return out;
  }
  void emptyCache(c10::MempoolId_t mempool_id) override {
    // The shared cache, with the pools nobody holds; or, for a pool id, that pool's free
    // segments only (held pools otherwise keep their memory: torch's graphs may replay into
    // it). torch calls this from destructors (MemPool's): it warns rather than throws.
    cuda_allocators::for_each([mempool_id](int device, CachingAllocator& allocator) {
      try {
        if (mempool_id == kSharedPoolId) {
          allocator.empty_cache();
        } else {
          allocator.release_pool_cache(mempool_id);
        }
      } catch (const std::exception& error) {
        TORCH_WARN("stowage: emptying the cache of device ", device, " failed: ", error.what());
      }
    });
  }
  void cacheInfo(c10::DeviceIndex device, std::size_t* largest_block) override {
    *largest_block = allocator_of(device).largest_available_block();
  }
  void* getBaseAllocation(void* ptr, std::size_t* size) override {
    CachingAllocator* owner = cuda_allocators::owning(ptr);
    TORCH_CHECK(owner != nullptr, "getBaseAllocation: ", ptr, " is not memory stowage allocated");
    const auto [base, bytes] = owner->base_allocation(ptr);
    if (size != nullptr) *size = bytes;
    return base;
  }

  using PluggableBase::recordStream;
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    // Memory from elsewhere (from_blob, say) is not ours to track, as in torch's allocator.
    if (ptr.get() == nullptr || ptr.get_deleter() != &delete_block) return;
    allocator_of(ptr.device().index()).record_stream(ptr.get(), to_stream(stream.stream()));
  }

  // --- stats ---

  // A device stowage has not allocated on has all-zero stats (asking does not open it).
  cda::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    const CachingAllocator* allocator = existing(device);
    return to_torch(allocator != nullptr ? allocator->stats() : DeviceStats{});
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    if (CachingAllocator* allocator = existing(device)) allocator->reset_accumulated_stats();
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    if (CachingAllocator* allocator = existing(device)) allocator->reset_peak_stats();
  }

  // --- snapshot and history ---

  cca::SnapshotInfo snapshot(c10::MempoolId_t mempool_id, bool include_traces) override {
    cca::SnapshotInfo out;
    // A device count needs the driver: asked only once torch has initialised CUDA (Note [No CUDA
    // before the program's]); before, no allocator exists and there are no traces.
    const int devices = initialized() ? c10::cuda::device_count() : 0;
    out.device_traces.resize(static_cast<std::size_t>(std::max(0, devices)));
    const auto approx_time_of = clock_.converter();
    cuda_allocators::for_each([&](int device, CachingAllocator& allocator) {
      const AllocatorSnapshot shot = allocator.snapshot();
      for (const SegmentSnapshot& segment : shot.segments) {
        if (mempool_id != kSharedPoolId && segment.owner != mempool_id) continue;
        cda::SegmentInfo& info = out.segments.emplace_back();
        info.device = static_cast<c10::DeviceIndex>(device);
        info.address = segment.address;
        info.total_size = segment.total_size;
        info.requested_size = segment.requested_size;
        info.allocated_size = segment.allocated_size;
        info.active_size = segment.active_size;
        info.stream = to_cuda_stream(segment.stream);
        info.is_large = segment.size_class == SizeClass::kLarge;
        info.is_expandable = segment.is_expandable;
        info.owner_private_pool_id = segment.owner;
        info.context_when_allocated = contexts_.find(segment.context);
        for (const BlockSnapshot& block : segment.blocks) {
          cda::BlockInfo& b = info.blocks.emplace_back();
          b.size = block.size;
          b.requested_size = block.requested_size;
          b.allocated = block.state == BlockState::kAllocated;
          b.active = block.state != BlockState::kFree;
          b.context_when_allocated = contexts_.find(block.context);
        }
      }
      if (!include_traces || static_cast<std::size_t>(device) >= out.device_traces.size()) return;
      append_trace(device, shot, approx_time_of, out.device_traces[static_cast<std::size_t>(device)]);
    });
    out.config_metadata.garbage_collection_threshold = 0;
    out.config_metadata.max_split_size = 0;
    out.config_metadata.pinned_num_register_threads = 0;
    out.config_metadata.expandable_segments = false;
    out.config_metadata.release_lock_on_malloc = false;
    out.config_metadata.pinned_use_host_register = false;
    out.config_metadata.graph_capture_record_stream_reuse = false;
    out.config_metadata.last_allocator_settings = "stowage:" + cuda_allocators::configuration();
    if (CachingAllocator* any = cuda_allocators::find(0)) {
      const AllocatorConfig& config = any->config();
      out.config_metadata.max_split_size =
          config.max_split_size == AllocatorConfig::kUnlimited ? 0 : config.max_split_size;
      out.config_metadata.expandable_segments = config.virtual_memory != VirtualMemoryMode::kOff;
    }
    return out;
  }

  bool isHistoryEnabled() override { return history_enabled_.load(); }

  void recordHistory(bool enabled, cca::CreateContextFn context_recorder,
                     std::size_t alloc_trace_max_entries, cca::RecordContext when,
                     bool clear_history, const std::vector<std::string>& skip_actions) override {
    std::size_t entries = 0;
    {
      std::lock_guard lock(mutex_);
      context_recorder_ = when == cca::RecordContext::NEVER ? nullptr : context_recorder;
      record_context_ = enabled ? when : cca::RecordContext::NEVER;
      max_entries_ = std::max<std::size_t>(alloc_trace_max_entries, 1);
      skip_actions_.clear();
      for (const std::string& name : skip_actions) {
        skip_actions_.insert(cda::parseTraceEntryAction(name));  // names an unknown one
      }
      entries = max_entries_;
    }
    history_enabled_.store(enabled);
    // History is kept by every device's allocator, made now or later.
    auto apply = [enabled, entries, clear_history](int, CachingAllocator& allocator) {
      if (clear_history) allocator.record_history(false);
      allocator.record_history(enabled, entries);
    };
    if (clear_history) contexts_.clear();
    cuda_allocators::for_each(apply);
    std::lock_guard lock(mutex_);
    pending_history_ = apply;
    if (clear_history || !enabled) {  // (the allocators' history positions start again from 0)
      for (auto& [device, marks] : metadata_marks_) marks = {{0, user_metadata_}};
    }
  }

  // Each trace event recorded from now on carries `metadata`, as under torch's allocator.
  void setUserMetadata(const std::string& metadata) override {
    std::vector<std::pair<int, std::uint64_t>> positions;
    cuda_allocators::for_each(
        [&](int device, CachingAllocator& allocator) { positions.emplace_back(device, allocator.history_recorded()); });
    std::lock_guard lock(mutex_);
    user_metadata_ = metadata;
    for (const auto& [device, at] : positions) {
      MetadataMarks& marks = metadata_marks_[device];
      if (!marks.empty() && marks.back().first == at) marks.pop_back();
      marks.emplace_back(at, metadata);
    }
  }
  std::string getUserMetadata() override {
    std::lock_guard lock(mutex_);
    return user_metadata_;
  }

  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override {
    std::lock_guard lock(mutex_);
    oom_observers_.push_back(std::move(observer));
  }
  void attachAllocatorTraceTracker(cda::AllocatorTraceTracker tracker) override {
    {
      std::lock_guard lock(mutex_);
      trace_trackers_.push_back(std::move(tracker));
    }
    // Listening costs a clock reading per event, so allocators listen only once someone asks.
    if (has_trackers_.exchange(true)) return;
    cuda_allocators::on_create([this](int device, CachingAllocator& allocator) {
      allocator.add_trace_listener([this, device](const TraceEntry& entry) {
        std::vector<cda::AllocatorTraceTracker> trackers;
        {
          std::lock_guard lock(mutex_);
          trackers = trace_trackers_;
        }
        const cda::TraceEntry torch_entry(
            to_torch(entry.action), static_cast<c10::DeviceIndex>(device), entry.address,
            entry.size, to_cuda_stream(entry.stream), {0, 0}, c10::getApproximateTime());
        for (const auto& listen : trackers) listen(torch_entry);
      });
    });
  }

  // --- private pools: CUDA graphs, MemPool, cudagraph trees ---

  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override {
    allocator_of(device).begin_allocate_to_pool(
        mempool_id, [filter = std::move(filter)](Stream stream) {
          return filter(static_cast<cudaStream_t>(to_cuda_stream(stream)));
        });
  }
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override {
    allocator_of(device).end_allocate_to_pool(mempool_id);
  }
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override {
    try {  // called from destructors (MemPool's, CUDAGraph's): warn, never throw
      CachingAllocator* allocator = existing(device);
      STOWAGE_CHECK(allocator != nullptr, "stowage has no allocator on device ", device);
      allocator->release_pool(mempool_id);
    } catch (const std::exception& error) {
      TORCH_WARN("stowage: releasing private pool (", mempool_id.first, ", ", mempool_id.second,
                 ") failed: ", error.what());
    }
  }
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                   bool use_on_oom) override {
    try {  // ~MemPool turns it off
      allocator_of(device).set_pool_use_on_oom(mempool_id, use_on_oom);
    } catch (const std::exception& error) {
      TORCH_WARN("stowage: setUseOnOOM on private pool (", mempool_id.first, ", ",
                 mempool_id.second, "): ", error.what());
    }
  }
  void setNoSplit(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override {
    allocator_of(device).set_pool_no_split(mempool_id);
  }
  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override {
    return allocator_of(device).pool_use_count(mempool_id);
  }
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                          std::shared_ptr<cca::CUDAAllocator> allocator) override {
    TORCH_CHECK(allocator == nullptr || allocator.get() == this,
                "stowage serves torch's MemPools itself: a MemPool with another allocator cannot "
                "be used while stowage is torch's CUDA allocator");
    allocator_of(device).create_or_incref_pool(mempool_id);
  }
  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                const std::unordered_set<void*>& expected) override {
    const std::vector<void*> live = allocator_of(device).pool_allocations(mempool_id);
    if (live.size() != expected.size()) return false;
    return std::all_of(live.begin(), live.end(), [&](void* p) { return expected.contains(p); });
  }
  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device,
                                                          c10::MempoolId_t id) override {
    return std::make_shared<PoolState>(device, allocator_of(device).checkpoint_pool(id));
  }
  cca::CheckpointDelta setCheckpointPoolState(
      c10::DeviceIndex device, std::shared_ptr<cca::AllocatorState> state) override {
    const auto* pool_state = dynamic_cast<const PoolState*>(state.get());
    TORCH_CHECK(pool_state != nullptr && pool_state->device == device,
                "setCheckpointPoolState: the state was not taken by stowage on device ", device);
    const PoolRestore restore = allocator_of(device).restore_pool(pool_state->checkpoint);
    cca::CheckpointDelta delta;
    delta.ptrs_freed = restore.freed;
    for (void* ptr : restore.allocated) {
      delta.dataptrs_allocd.emplace_back(ptr, ptr, &delete_block,
                                         c10::Device(c10::DeviceType::CUDA, device));
    }
    return delta;
  }

  // Copies between devices go through cudaMemcpyPeerAsync: memory mapped through the driver's
  // virtual-memory calls is not covered by peer access, and cudaMemcpyPeerAsync works without
  // it.
  cudaError_t memcpyAsync(void* dst, int dst_device, const void* src, int src_device,
                          std::size_t count, cudaStream_t stream, bool p2p_enabled) override {
    if (dst_device == src_device) {
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    }
    (void)p2p_enabled;
    return cudaMemcpyPeerAsync(dst, dst_device, src, src_device, count, stream);
  }

  // --- refused ---

  std::shared_ptr<void> getIpcDevPtr(std::string /*handle*/) override {
    TORCH_CHECK(false, "stowage does not support CUDA IPC (sharing CUDA tensors between "
                "processes); run without STOWAGE_ALLOC_CONF for that workload");
  }
  cca::ShareableHandle shareIpcHandle(void* /*ptr*/) override {
    TORCH_CHECK(false, "stowage does not support CUDA IPC (sharing CUDA tensors between "
                "processes); run without STOWAGE_ALLOC_CONF for that workload");
  }

  std::string name() override { return "stowage"; }

  // Applies the latest recordHistory() to an allocator made after it.
  void apply_history(int device, CachingAllocator& allocator) {
    std::function<void(int, CachingAllocator&)> apply;
    {
      std::lock_guard lock(mutex_);
      apply = pending_history_;
    }
    if (apply) apply(device, allocator);
  }

 private:
  bool caching() const noexcept { return caching_.load(std::memory_order_relaxed); }

  static void* malloc_uncached(std::size_t size, c10::DeviceIndex device) {
    if (size == 0) return nullptr;
    DeviceBackend& backend = allocator_of(device).backend();
    void* ptr = uncached().allocate(backend, size);
    if (ptr == nullptr) {
      const MemoryInfo memory = backend.memory_info();
      namespace format = c10::CachingAllocator;
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate ",
                       format::format_size(size), ". GPU ", static_cast<int>(device),
                       " has a total capacity of ", format::format_size(memory.total_bytes),
                       " of which ", format::format_size(memory.free_bytes),
                       " is free. stowage: caching is off (torch.cuda.caching_allocator_enable(False)),"
                       " so the device itself refused the allocation; stowage's cache was not asked.");
    }
    return ptr;
  }

  void* malloc_on(std::size_t size, c10::DeviceIndex device, cudaStream_t stream) {
    if (size == 0) return nullptr;
    try {
      CachingAllocator& allocator = allocator_of(device);
      void* ptr = allocator.malloc(size, to_stream(stream));
      if (c10::memoryProfilingEnabled()) {
        report_to_profiler(allocator, device, ptr, static_cast<std::int64_t>(allocator.block_size(ptr)));
      }
      return ptr;
    } catch (const OutOfMemory& error) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, error.message());
    }
    return nullptr;  // (not reached: the check throws)
  }

  // A device's trace in torch's form: the actions skip_actions leaves out dropped, stacks kept as
  // the record mode says, each event with the user metadata in force when it was recorded
  // (stowage's own markers, step ends and fit's trials, keep theirs).
  void append_trace(int device, const AllocatorSnapshot& shot,
                    const std::function<c10::approx_time_t(std::int64_t)>& approx_time_of,
                    std::vector<cda::TraceEntry>& trace) {
    std::set<cda::TraceEntry::Action> skipped;
    cca::RecordContext when = cca::RecordContext::NEVER;
    MetadataMarks marks;
    {
      std::lock_guard lock(mutex_);
      skipped = skip_actions_;
      when = record_context_;
      if (const auto found = metadata_marks_.find(device); found != metadata_marks_.end()) marks = found->second;
    }
    trace.reserve(shot.trace.size());
    const std::uint64_t first = shot.trace_recorded - std::min<std::uint64_t>(shot.trace_recorded, shot.trace.size());
    for (std::size_t i = 0; i < shot.trace.size(); ++i) {
      const TraceEntry& entry = shot.trace[i];
      if (skipped.contains(to_torch(entry.action))) continue;
      const std::string_view marker = marker_metadata(entry.action);
      trace.emplace_back(to_torch(entry.action), static_cast<c10::DeviceIndex>(device), entry.address, entry.size,
                         to_cuda_stream(entry.stream), c10::MempoolId_t{0, 0}, approx_time_of(entry.time_us),
                         trace_keeps_context(when, entry.action) ? contexts_.find(entry.context) : nullptr, "",
                         marker.empty() ? metadata_at(marks, first + i) : std::string(marker));
    }
  }

  // The context provider: torch's stack for this event, when history asks for one.
  std::uint64_t gather_context() {
    cca::CreateContextFn recorder = nullptr;
    {
      std::lock_guard lock(mutex_);
      recorder = context_recorder_;
    }
    if (recorder == nullptr) return 0;
    if (contexts_.wants_pruning()) prune_contexts();
    return contexts_.intern(recorder());
  }

  void prune_contexts() {
    std::unordered_set<std::uint64_t> referenced;
    cuda_allocators::for_each([&](int, CachingAllocator& allocator) {
      const AllocatorSnapshot shot = allocator.snapshot();
      for (const SegmentSnapshot& segment : shot.segments) {
        referenced.insert(segment.context);
        for (const BlockSnapshot& block : segment.blocks) referenced.insert(block.context);
      }
      for (const TraceEntry& entry : shot.trace) referenced.insert(entry.context);
    });
    contexts_.prune(referenced);
  }

  std::mutex mutex_;  // guards the observers, trackers and history settings
  std::vector<cca::OutOfMemoryObserver> oom_observers_;
  std::vector<cda::AllocatorTraceTracker> trace_trackers_;
  std::atomic<bool> has_trackers_{false};
  cca::CreateContextFn context_recorder_ = nullptr;
  cca::RecordContext record_context_ = cca::RecordContext::NEVER;  // _record_memory_history's context
  std::string user_metadata_;                                       // _set_memory_metadata's, in force
  std::map<int, MetadataMarks> metadata_marks_;                     // ... and since when, per device
  std::size_t max_entries_ = 1;
  std::set<cda::TraceEntry::Action> skip_actions_;  // left out of snapshots' traces
  std::function<void(int, CachingAllocator&)> pending_history_;
  std::atomic<bool> history_enabled_{false};
  std::atomic<bool> initialized_flag_{false};
  std::atomic<bool> caching_{true};  // torch.cuda.caching_allocator_enable
  GatheredContexts contexts_;
  ClockMapping clock_;
};

struct State {
  std::mutex mutex;
  std::shared_ptr<StowageCudaAllocator> allocator;
};

State& state() {
  static auto* instance = new State();  // never destroyed: tensors outlive static destructors
  return *instance;
}

}  // namespace

void enable(const std::string& config) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (s.allocator != nullptr && cca::get() == s.allocator.get()) {
    cuda_allocators::configure(config);
    return;
  }
  // No CUDA call here (Note [No CUDA before the program's]): whether the machine has a device is
  // the caller's question (stowage.enable asks torch, which asks NVML).
  cuda_allocators::configure(config);
  STOWAGE_CHECK(s.allocator == nullptr,
                "stowage was torch's CUDA allocator and was replaced; it cannot come back");
  cca::CUDAAllocator* current = cca::get();
  STOWAGE_CHECK(current == nullptr || !current->initialized(),
                "CUDA is already initialised in this process, so torch keeps its own allocator. "
                "Enable stowage before the first CUDA tensor: set STOWAGE_ALLOC_CONF (empty for "
                "the defaults) in the environment, or call stowage.enable() right after "
                "importing torch");
  auto allocator = std::make_shared<StowageCudaAllocator>();
  cuda_allocators::on_create([raw = allocator.get()](int device, CachingAllocator& caching) {
    raw->apply_history(device, caching);
  });
  torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
  // The device-generic registry too: torch.accelerator's memory functions ask it.
  c10::SetAllocator(c10::DeviceType::CUDA, allocator.get(), /*priority=*/std::uint8_t{255});
  s.allocator = std::move(allocator);
}

bool is_enabled() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return s.allocator != nullptr && cca::get() == s.allocator.get();
}

const char* supported_torch_versions() { return "2.11"; }

}  // namespace stowage::torch_cuda
