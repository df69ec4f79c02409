// Steady state on the paged path (Note [Stitching]): a training loop whose shapes cycle makes no
// device call once warm while the device has room, still fits (moving pages) when it has none,
// and says per step what it asked of the device.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "allocator/caching_allocator.hpp"
#include "base/byte_units.hpp"
#include "device/host/host_backend.hpp"

namespace stowage {
namespace {

constexpr std::size_t MiB = kMiB;

// The calls that change what is mapped where.
std::uint64_t memory_calls(HostBackend& backend) {
  std::uint64_t total = 0;
  for (const BackendCall call :
       {BackendCall::kCreatePhysical, BackendCall::kReleasePhysical, BackendCall::kMap,
        BackendCall::kSetAccess, BackendCall::kUnmap, BackendCall::kReserve,
        BackendCall::kReleaseReservation, BackendCall::kSynchronize}) {
    total += backend.faults().calls(call);
  }
  return total;
}

// One training step whose activations scale with `length`: a forward pass that keeps what
// backward needs, then a backward pass that frees it in reverse, with short-lived temporaries
// and a few small tensors between, and one tensor (a metric, say) that lives on into the next
// step's forward, so each step's layout is cut by the one before. Every block is filled with a
// pattern and checked before it is freed, so blocks that overlap or pages mapped wrongly would
// show.
class Step {
 public:
  explicit Step(CachingAllocator& allocator) : allocator_(allocator) {}
  ~Step() {
    if (carried_.first != nullptr) allocator_.free(carried_.first);
  }

  void run(std::size_t length) {
    std::vector<std::pair<void*, std::size_t>> saved;
    for (std::size_t layer = 0; layer < 6; ++layer) {
      // Activations grow with the length, attention's with its square.
      const std::size_t activation =
          layer % 2 == 0 ? length * 3 * MiB / 8 + 4096 : length * length * 40 * 1024 + 4096;
      saved.push_back(allocate(activation));
      const auto temporary = allocate(length * length * 24 * 1024 + 512);
      const auto small = allocate(24 * 1024 + layer * 512);
      release(temporary);
      saved.push_back(small);
      if (layer == 2 && carried_.first != nullptr) release(carried_);
      if (layer == 3) carried_ = allocate(length * MiB / 3 + 1024);
    }
    const auto logits = allocate(length * 2 * MiB);
    release(logits);
    while (!saved.empty()) {
      const auto gradient = allocate(saved.back().second);
      release(gradient);
      release(saved.back());
      saved.pop_back();
    }
  }

 private:
  std::pair<void*, std::size_t> allocate(std::size_t bytes) {
    void* block = allocator_.malloc(bytes);
    std::memset(block, static_cast<int>(bytes % 251), bytes);
    return {block, bytes};
  }

  void release(const std::pair<void*, std::size_t>& block) {
    const auto* bytes = static_cast<const unsigned char*>(block.first);
    const auto pattern = static_cast<unsigned char>(block.second % 251);
    for (std::size_t i = 0; i < block.second; i += 4093) {
      ASSERT_EQ(bytes[i], pattern) << "block " << block.first << " was overwritten";
    }
    ASSERT_EQ(bytes[block.second - 1], pattern);
    allocator_.free(block.first);
  }

  CachingAllocator& allocator_;
  std::pair<void*, std::size_t> carried_{nullptr, 0};
};

constexpr std::size_t kLengths[] = {16, 8, 12, 4};  // a cycle of four sequence lengths

HostBackendOptions device_of(std::size_t capacity) {
  HostBackendOptions options;
  options.capacity_bytes = capacity;
  options.synchronous = true;
  return options;
}

TEST(SteadyState, ACyclingLoopMakesNoDeviceCallAfterItsSecondCycle) {
  HostBackend backend(device_of(1024 * MiB));
  CachingAllocator allocator(backend, parse_allocator_config("virtual_memory:on"));
  Step step(allocator);
  std::uint64_t calls_after_warmup = 0;
  for (int cycle = 0; cycle < 6; ++cycle) {
    for (const std::size_t length : kLengths) {
      const std::uint64_t before = memory_calls(backend);
      step.run(length);
      allocator.mark_step();
      if (cycle >= 2) {
        calls_after_warmup += memory_calls(backend) - before;
        EXPECT_EQ(allocator.stats().last_step.device_calls, 0) << "cycle " << cycle;
        EXPECT_EQ(allocator.stats().last_step.maps, 0);
      }
    }
    allocator.check_invariants();
  }
  EXPECT_EQ(calls_after_warmup, 0u) << "the device was called once warm";
  EXPECT_GT(allocator.stats().num_maps, 0) << "the first cycle mapped its pages";
  EXPECT_EQ(allocator.stats().num_unmaps, 0) << "with room to spare, no page moved";
  EXPECT_EQ(allocator.stats().num_steps, 24);
}

TEST(SteadyState, WithoutRoomToSpendTheSameLoopMovesPages) {
  // move_pages_above:0 spends no room: beyond the reserve budget pages move, step after step
  // until the budget has learned the loop's layout.
  HostBackend backend(device_of(1024 * MiB));
  CachingAllocator allocator(backend,
                             parse_allocator_config("virtual_memory:on,move_pages_above:0"));
  Step step(allocator);
  for (int cycle = 0; cycle < 2; ++cycle) {
    for (const std::size_t length : kLengths) step.run(length);
  }
  EXPECT_GT(allocator.stats().num_unmaps, 0) << "pages moved to keep the reserve near the peak";
}

TEST(SteadyState, NearTheCapacityTheLoopStillRunsByMovingPages) {
  // What the loop reserves when it never moves a page (room to spare), and its peak in use; then
  // a device halfway between, where only moving pages lets it run.
  std::size_t unmoved = 0;
  std::size_t peak = 0;
  {
    HostBackend roomy(device_of(1024 * MiB));
    CachingAllocator allocator(roomy, parse_allocator_config("virtual_memory:on"));
    Step step(allocator);
    for (int cycle = 0; cycle < 3; ++cycle) {
      for (const std::size_t length : kLengths) step.run(length);
    }
    unmoved = static_cast<std::size_t>(allocator.stats().reserved_bytes.all().peak);
    peak = static_cast<std::size_t>(allocator.stats().allocated_bytes.all().peak);
  }
  ASSERT_GT(unmoved, peak + 8 * MiB) << "the loop's layout wastes nothing: it cannot show moves";
  HostBackend backend(device_of(round_up((unmoved + peak) / 2, 2 * MiB)));
  CachingAllocator allocator(backend, parse_allocator_config("virtual_memory:on"));
  Step step(allocator);
  for (int cycle = 0; cycle < 3; ++cycle) {
    for (const std::size_t length : kLengths) step.run(length);
  }
  EXPECT_EQ(allocator.stats().num_ooms, 0);
  EXPECT_GT(allocator.stats().num_unmaps, 0) << "with no room to spend, pages moved instead";
  allocator.check_invariants();
}

TEST(SteadyState, EachStepSaysWhatItAskedOfTheDevice) {
  HostBackend backend(device_of(256 * MiB));
  CachingAllocator allocator(backend, parse_allocator_config("virtual_memory:on"));
  void* block = allocator.malloc(5 * MiB);  // three new pages, mapped and made accessible
  allocator.mark_step();
  const DeviceStats first = allocator.stats();
  EXPECT_EQ(first.num_steps, 1);
  EXPECT_EQ(first.last_step.maps, 3);
  EXPECT_EQ(first.last_step.unmaps, 0);
  // A reservation, three pages created and mapped, one set_access.
  EXPECT_EQ(first.last_step.device_calls, 8);
  EXPECT_GE(first.last_step.device_call_ns, 0);
  allocator.free(block);
  allocator.free(allocator.malloc(5 * MiB));  // cached: no device call
  allocator.mark_step();
  EXPECT_EQ(allocator.stats().last_step.device_calls, 0);
  EXPECT_EQ(allocator.stats().last_step.maps, 0);
  allocator.reset_accumulated_stats();
  allocator.mark_step();
  EXPECT_EQ(allocator.stats().last_step.device_calls, 0) << "no negative step after a reset";
}

}  // namespace
}  // namespace stowage
