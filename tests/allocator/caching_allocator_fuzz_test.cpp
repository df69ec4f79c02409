// Random walks over the CachingAllocator, checked after every step.
// (Sizes and device are a quarter as large on the paged path, see below.)
//
// Each live block carries its id in its first and last 8 bytes and in one word per 4 KiB page,
// written at malloc and verified at free: two blocks that overlap overwrite each other's ids.
// check_invariants() runs after every step. Sizes are log-uniform from 1 B to 256 MiB on a
// 2 GiB simulated device, so the walk spends time near full memory, in the miss path and in OOM.
// Streams are real (worker threads, delayed at random), record_stream makes frees wait on them,
// and backend calls fail at random (segment allocation, event creation and recording).
//
// Each walk runs on both paths: whole segments (virtual_memory:off) and paged (virtual_memory:on,
// where faults also hit page creation, map, set_access, unmap and reservations). Operation
// counts on the segment path: 10^6 in a release build (four walks of 2.5 * 10^5), 10^5 under
// ASan+UBSan, 2 * 10^4 under TSan; on the paged path 10^5, 2 * 10^4 and 10^4: near a full
// device it moves pages on most misses, and the simulated device pays a host page fault per
// 4 KiB of every page it maps and the walk touches. The threaded walk (paged, the default) has 16
// threads, each freeing blocks another allocated. STOWAGE_FUZZ_OPS overrides the total of each
// walk.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "allocator/caching_allocator.hpp"
#include "base/errors.hpp"
#include "base/log.hpp"
#include "base/sanitizers.hpp"
#include "device/host/host_backend.hpp"
#include "tests/support/quiet_log.hpp"

namespace stowage {
namespace {

#if defined(STOWAGE_THREAD_SANITIZER)
constexpr std::size_t kWalkOps = 20'000;
constexpr std::size_t kPagedWalkOps = 10'000;
constexpr std::size_t kThreadedOps = 20'000;
#elif defined(STOWAGE_ADDRESS_SANITIZER)
constexpr std::size_t kWalkOps = 100'000;
constexpr std::size_t kPagedWalkOps = 20'000;
constexpr std::size_t kThreadedOps = 20'000;
#else
constexpr std::size_t kWalkOps = 1'000'000;
constexpr std::size_t kPagedWalkOps = 100'000;
constexpr std::size_t kThreadedOps = 100'000;
#endif
constexpr std::size_t kWalks = 4;
constexpr std::size_t kMaxSize = std::size_t{256} << 20;
constexpr std::size_t kPage = 4096;

std::size_t ops_or_override(std::size_t ops) {
  if (const char* text = std::getenv("STOWAGE_FUZZ_OPS")) return std::strtoull(text, nullptr, 10);
  return ops;
}

// Where a block's pattern words go: its first 8 bytes, one word per 4 KiB page, and its last 8
// bytes; words never overlap (they would overwrite each other's bytes).
template <typename Fn>
void for_each_pattern_word(std::size_t size, Fn&& fn) {
  constexpr std::size_t kWord = sizeof(std::uint64_t);
  fn(std::size_t{0}, std::min(size, kWord));
  if (size < 2 * kWord) return;
  for (std::size_t offset = kPage; offset + 2 * kWord <= size; offset += kPage) fn(offset, kWord);
  fn(size - kWord, kWord);
}

void write_pattern(void* ptr, std::size_t size, std::uint64_t id) {
  auto* bytes = static_cast<unsigned char*>(ptr);
  for_each_pattern_word(size, [&](std::size_t offset, std::size_t length) {
    std::memcpy(bytes + offset, &id, length);
  });
}

// True when every word of the pattern still holds `id`.
bool pattern_intact(const void* ptr, std::size_t size, std::uint64_t id) {
  const auto* bytes = static_cast<const unsigned char*>(ptr);
  bool intact = true;
  for_each_pattern_word(size, [&](std::size_t offset, std::size_t length) {
    intact = intact && std::memcmp(bytes + offset, &id, length) == 0;
  });
  return intact;
}

std::size_t log_uniform_size(std::mt19937_64& random, std::size_t max_size = kMaxSize) {
  std::uniform_real_distribution<double> exponent(0.0, std::log(static_cast<double>(max_size)));
  return std::max<std::size_t>(1, static_cast<std::size_t>(std::exp(exponent(random))));
}

HostBackendOptions fuzz_device(std::size_t capacity = std::size_t{2} << 30) {
  HostBackendOptions options;
  options.capacity_bytes = capacity;
  return options;
}

using testing::QuietLog;

struct Live {
  void* ptr;
  std::size_t size;
  std::uint64_t id;
};

class AllocatorWalk : public ::testing::TestWithParam<std::tuple<bool, std::size_t>> {};

TEST_P(AllocatorWalk, KeepsBlocksDisjointAndInvariantsTrue) {
  const auto [paged, seed] = GetParam();
  const std::size_t ops = ops_or_override(paged ? kPagedWalkOps : kWalkOps) / kWalks;
  QuietLog quiet;
  // The paged walks use a quarter of the sizes and of the device (the same pressure).
  const std::size_t max_size = paged ? kMaxSize / 4 : kMaxSize;
  HostBackend backend(fuzz_device(paged ? std::size_t{512} << 20 : std::size_t{2} << 30));
  // Odd walks also exercise the oversize class.
  std::string config = paged ? "virtual_memory:on" : "virtual_memory:off";
  if (seed % 2) config += ",max_split_size_mb:64";
  CachingAllocator allocator(backend, parse_allocator_config(config));
  std::mt19937_64 random(seed);
  std::vector<Stream> streams{Stream{0}, backend.create_stream(), backend.create_stream(),
                              backend.create_stream()};
  auto pick = [&](std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(random); };
  std::vector<Live> live;
  std::uint64_t next_id = 1;
  std::size_t ooms = 0;
  std::size_t pending_frees = 0;

  for (std::size_t step = 0; step < ops; ++step) {
    const std::size_t roll = pick(100);
    if (roll < 45) {
      const std::size_t size = log_uniform_size(random, max_size);
      const Stream stream = streams[pick(streams.size())];
      try {
        void* ptr = allocator.malloc(size, stream);
        write_pattern(ptr, size, next_id);
        live.push_back({ptr, size, next_id++});
      } catch (const OutOfMemory&) {
        ++ooms;
      }
    } else if (roll < 85) {
      if (live.empty()) continue;
      const std::size_t index = pick(live.size());
      const Live block = live[index];
      ASSERT_TRUE(pattern_intact(block.ptr, block.size, block.id))
          << "block " << block.id << " was overwritten (step " << step << ")";
      allocator.free(block.ptr);
      live[index] = live.back();
      live.pop_back();
    } else if (roll < 90) {
      if (live.empty()) continue;
      allocator.record_stream(live[pick(live.size())].ptr, streams[pick(streams.size())]);
      ++pending_frees;
    } else if (roll < 91) {
      allocator.empty_cache();
    } else if (roll < 95) {
      const auto delay = std::chrono::microseconds(pick(200));
      backend.enqueue_host_function(streams[pick(streams.size())],
                                    [delay] { std::this_thread::sleep_for(delay); });
    } else if (roll < 96) {
      static constexpr BackendCall kSegmentFaults[] = {
          BackendCall::kAllocateSegment, BackendCall::kCreateEvent, BackendCall::kRecordEvent};
      static constexpr BackendCall kPagedFaults[] = {
          BackendCall::kCreatePhysical, BackendCall::kMap,         BackendCall::kSetAccess,
          BackendCall::kUnmap,          BackendCall::kReserve,     BackendCall::kCreateEvent,
          BackendCall::kRecordEvent};
      if (paged) {
        backend.faults().fail_nth(kPagedFaults[pick(std::size(kPagedFaults))], 1 + pick(3));
      } else {
        backend.faults().fail_nth(kSegmentFaults[pick(std::size(kSegmentFaults))], 1 + pick(3));
      }
    } else {
      if (live.empty()) continue;
      const Live& block = live[pick(live.size())];
      ASSERT_TRUE(pattern_intact(block.ptr, block.size, block.id))
          << "block " << block.id << " was overwritten (step " << step << ")";
    }
    allocator.check_invariants();
    if (::testing::Test::HasFatalFailure()) return;
  }
  for (const Live& block : live) {
    ASSERT_TRUE(pattern_intact(block.ptr, block.size, block.id));
    allocator.free(block.ptr);
  }
  backend.faults().clear();
  allocator.empty_cache();
  allocator.check_invariants();
  EXPECT_EQ(allocator.stats().reserved_bytes.all().current, 0);
  EXPECT_EQ(backend.used_bytes(), 0u);
  EXPECT_EQ(allocator.stats().num_invalid_frees, 0);
  EXPECT_GT(ooms, 0u) << "the walk never reached the out-of-memory path";
  EXPECT_GT(pending_frees, 0u);
  for (std::size_t i = 1; i < streams.size(); ++i) backend.destroy_stream(streams[i]);
}

INSTANTIATE_TEST_SUITE_P(Seeds, AllocatorWalk,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Range<std::size_t>(1, 1 + kWalks)),
                         [](const auto& test_case) {
                           return std::string(std::get<0>(test_case.param) ? "paged" : "segments") +
                                  "_" + std::to_string(std::get<1>(test_case.param));
                         });

// 16 threads; each allocates, writes its pattern and hands the block to the next thread, which
// verifies and frees it: allocation and free of one block always happen on different threads.
TEST(AllocatorThreadedWalk, BlocksFreedByAnotherThreadStayIntact) {
  constexpr std::size_t kThreads = 16;
  const std::size_t ops_per_thread = ops_or_override(kThreadedOps) / kThreads;
  QuietLog quiet;
  HostBackend backend(fuzz_device());
  CachingAllocator allocator(backend);
  std::vector<std::vector<Live>> inboxes(kThreads);
  std::vector<std::mutex> inbox_locks(kThreads);
  std::atomic<std::size_t> corrupted{0};
  std::atomic<std::size_t> completed{0};
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 random(1000 + t);
      const Stream stream = backend.create_stream();
      std::uint64_t next_id = (static_cast<std::uint64_t>(t) << 48) + 1;
      for (std::size_t step = 0; step < ops_per_thread; ++step) {
        if (random() % 2 == 0) {
          // Smaller sizes than the single-threaded walk: 16 threads share the 2 GiB.
          const std::size_t size = std::max<std::size_t>(1, log_uniform_size(random) >> 4);
          try {
            void* ptr = allocator.malloc(size, stream);
            write_pattern(ptr, size, next_id);
            std::lock_guard lock(inbox_locks[(t + 1) % kThreads]);
            inboxes[(t + 1) % kThreads].push_back({ptr, size, next_id++});
          } catch (const OutOfMemory&) {
          }
        } else {
          std::vector<Live> received;
          {
            std::lock_guard lock(inbox_locks[t]);
            received.swap(inboxes[t]);
          }
          for (const Live& block : received) {
            if (!pattern_intact(block.ptr, block.size, block.id)) ++corrupted;
            allocator.free(block.ptr);
          }
        }
        allocator.check_invariants();
      }
      backend.destroy_stream(stream);
      ++completed;
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(completed.load(), kThreads);
  for (std::size_t t = 0; t < kThreads; ++t) {
    for (const Live& block : inboxes[t]) {
      if (!pattern_intact(block.ptr, block.size, block.id)) ++corrupted;
      allocator.free(block.ptr);
    }
  }
  EXPECT_EQ(corrupted.load(), 0u);
  allocator.empty_cache();
  allocator.check_invariants();
  EXPECT_EQ(allocator.stats().reserved_bytes.all().current, 0);
  EXPECT_EQ(allocator.stats().num_invalid_frees, 0);
}

}  // namespace
}  // namespace stowage
