// Learned placement in the CachingAllocator (Note [Learned placement]): learned addresses on a
// simulated device with real memory, the return to the dynamic path, faults and empty_cache.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "allocator/caching_allocator.hpp"
#include "allocator/memory_pressure.hpp"
#include "base/byte_units.hpp"
#include "base/errors.hpp"
#include "device/host/host_backend.hpp"
#include "tests/support/quiet_log.hpp"

namespace stowage {
namespace {

constexpr std::size_t MiB = kMiB;

HostBackendOptions device_of(std::size_t capacity) {
  HostBackendOptions options;
  options.capacity_bytes = capacity;
  options.synchronous = true;
  return options;
}

// Live allocations, each filled with a pattern of its id and checked before it is freed: a
// laid-out address that overlapped live memory would show as a broken pattern.
class Tracked {
 public:
  explicit Tracked(CachingAllocator& allocator) : allocator_(allocator) {}
  ~Tracked() { release_all(); }

  std::size_t alloc(std::size_t bytes) {
    void* ptr = allocator_.malloc(bytes);
    const std::uint64_t id = next_id_++;
    fill(ptr, bytes, id);
    live_.push_back({ptr, bytes, id});
    return live_.size() - 1;
  }
  void free(std::size_t slot) {
    Entry& e = live_[slot];
    check(e);
    allocator_.free(e.ptr);
    e.ptr = nullptr;
  }
  void check_all() const {
    for (const Entry& e : live_) {
      if (e.ptr != nullptr) check(e);
    }
  }
  void release_all() {
    for (Entry& e : live_) {
      if (e.ptr != nullptr) allocator_.free(e.ptr);
      e.ptr = nullptr;
    }
  }
  void* ptr(std::size_t slot) const { return live_[slot].ptr; }

 private:
  struct Entry {
    void* ptr;
    std::size_t bytes;
    std::uint64_t id;
  };
  // The first and last 64 bytes and one in the middle: enough to catch an overlap, cheap.
  static void fill(void* ptr, std::size_t bytes, std::uint64_t id) {
    auto* p = static_cast<unsigned char*>(ptr);
    std::memset(p, static_cast<int>(id & 0xff), 64);
    std::memset(p + bytes - 64, static_cast<int>((id >> 8) & 0xff), 64);
    std::memcpy(p + bytes / 2 - 8, &id, sizeof id);
  }
  static void check(const Entry& e) {
    const auto* p = static_cast<const unsigned char*>(e.ptr);
    for (std::size_t i = 0; i < 64; ++i) {
      ASSERT_EQ(p[i], static_cast<unsigned char>(e.id & 0xff)) << "allocation " << e.id;
      ASSERT_EQ(p[e.bytes - 64 + i], static_cast<unsigned char>((e.id >> 8) & 0xff));
    }
    std::uint64_t stored = 0;
    std::memcpy(&stored, p + e.bytes / 2 - 8, sizeof stored);
    ASSERT_EQ(stored, e.id);
  }

  CachingAllocator& allocator_;
  std::vector<Entry> live_;
  std::uint64_t next_id_ = 1;
};

// A training-shaped step: forward saves one activation per layer (and frees a temporary),
// backward frees them in reverse while gradients appear; the gradients live until the next
// step begins (zero_grad), and the weights for the whole run.
struct TrainingStep {
  std::vector<std::size_t> activation;
  std::vector<std::size_t> gradient;

  explicit TrainingStep(std::uint64_t seed, std::size_t layers = 24) {
    std::mt19937_64 random(seed);
    for (std::size_t i = 0; i < layers; ++i) {
      activation.push_back(2 * MiB + random() % (12 * MiB) + 1);
      gradient.push_back(MiB + 1 + random() % (4 * MiB));
    }
  }

  void run(Tracked& memory, std::vector<std::size_t>& grads) const {
    for (std::size_t g : grads) memory.free(g);
    grads.clear();
    std::vector<std::size_t> saved;
    for (std::size_t i = 0; i < activation.size(); ++i) {
      const std::size_t temporary = memory.alloc(activation[i] / 2 + MiB);
      saved.push_back(memory.alloc(activation[i]));
      memory.free(temporary);
    }
    for (std::size_t i = activation.size(); i-- > 0;) {
      const std::size_t grad_input = memory.alloc(activation[i]);
      grads.push_back(memory.alloc(gradient[i]));
      memory.free(saved[i]);
      memory.free(grad_input);
    }
  }
};

class LearnedPlacementTest : public ::testing::Test {
 protected:
  LearnedPlacementTest()
      : backend_(device_of(1024 * MiB)),
        allocator_(backend_, parse_allocator_config("virtual_memory:on,placement:learned")) {}
  void TearDown() override { allocator_.check_invariants(); }

  HostBackend backend_;
  CachingAllocator allocator_;
};

TEST_F(LearnedPlacementTest, MarkedStepsArePlacedByTheLayoutAndStopMovingPages) {
  Tracked memory(allocator_);
  std::vector<std::size_t> weights;
  for (std::size_t i = 0; i < 8; ++i) weights.push_back(memory.alloc((i + 1) * 3 * MiB));
  const TrainingStep step(1);
  std::vector<std::size_t> grads;
  for (int i = 0; i < 3; ++i) {
    step.run(memory, grads);
    allocator_.mark_step();
    allocator_.check_invariants();
  }
  CachingAllocator::PlacementStatus status = allocator_.placement_status();
  ASSERT_EQ(status.phase, StepLearner::Phase::kPlaced);
  EXPECT_EQ(status.layouts_made, 1u);
  EXPECT_EQ(status.arena_bytes, 0u);  // it opens where the next step starts
  // The first laid-out step opens and maps the arena; from then on nothing moves.
  step.run(memory, grads);
  allocator_.mark_step();
  status = allocator_.placement_status();
  EXPECT_GT(status.arena_bytes, 0u);
  EXPECT_GE(status.arena_bytes, status.layout_live_bytes);
  const DeviceStats warm = allocator_.stats();
  for (int i = 0; i < 5; ++i) {
    step.run(memory, grads);
    allocator_.mark_step();
    allocator_.check_invariants();
    memory.check_all();
  }
  const DeviceStats later = allocator_.stats();
  EXPECT_EQ(later.num_maps, warm.num_maps);
  EXPECT_EQ(later.num_unmaps, warm.num_unmaps);
  status = allocator_.placement_status();
  EXPECT_EQ(status.phase, StepLearner::Phase::kPlaced);
  EXPECT_EQ(status.departures, 0);
  // Every allocation of the step (4 per layer) is placed, in every one of the 6 laid-out steps.
  EXPECT_EQ(status.placed_allocations, 6u * 4 * step.activation.size());
  EXPECT_EQ(later.reserved_bytes.all().peak, warm.reserved_bytes.all().peak);
}

TEST_F(LearnedPlacementTest, WithoutMarksTheRepeatingStepIsFoundAndPlaced) {
  Tracked memory(allocator_);
  const TrainingStep step(2);
  std::vector<std::size_t> grads;
  for (int i = 0; i < 8; ++i) {
    step.run(memory, grads);
    memory.check_all();
  }
  const CachingAllocator::PlacementStatus status = allocator_.placement_status();
  EXPECT_EQ(status.phase, StepLearner::Phase::kPlaced);
  EXPECT_GE(status.layouts_made, 1u);
  EXPECT_GT(status.placed_allocations, 0u);
}

TEST_F(LearnedPlacementTest, AStepThatDepartsFallsBackAndALaterSteadyRunIsLaidOutAgain) {
  Tracked memory(allocator_);
  const TrainingStep step(3);
  const TrainingStep other(4);  // other sizes: an evaluation step, a new sequence length
  std::vector<std::size_t> grads;
  for (int i = 0; i < 4; ++i) {
    step.run(memory, grads);
    allocator_.mark_step();
  }
  ASSERT_EQ(allocator_.placement_status().phase, StepLearner::Phase::kPlaced);
  other.run(memory, grads);
  allocator_.mark_step();
  allocator_.check_invariants();
  memory.check_all();
  EXPECT_EQ(allocator_.placement_status().departures, 1);
  for (int i = 0; i < 5; ++i) {
    other.run(memory, grads);
    allocator_.mark_step();
    allocator_.check_invariants();
    memory.check_all();
  }
  const CachingAllocator::PlacementStatus status = allocator_.placement_status();
  EXPECT_EQ(status.phase, StepLearner::Phase::kPlaced);
  EXPECT_EQ(status.layouts_made, 2u);
}

TEST_F(LearnedPlacementTest, AFailingMapIsADepartureNotAFailure) {
  Tracked memory(allocator_);
  const TrainingStep step(5);
  std::vector<std::size_t> grads;
  for (int i = 0; i < 3; ++i) {
    step.run(memory, grads);
    allocator_.mark_step();
  }
  ASSERT_EQ(allocator_.placement_status().phase, StepLearner::Phase::kPlaced);
  {
    testing::QuietLog quiet;
    backend_.faults().fail_nth(BackendCall::kMap, 1);
    step.run(memory, grads);
    allocator_.mark_step();
  }
  allocator_.check_invariants();
  memory.check_all();
  EXPECT_GE(allocator_.placement_status().departures, 1);
}

TEST_F(LearnedPlacementTest, EmptyCacheGivesTheArenaBackAndLearningStartsAgain) {
  Tracked memory(allocator_);
  const TrainingStep step(6);
  std::vector<std::size_t> grads;
  for (int i = 0; i < 4; ++i) {
    step.run(memory, grads);
    allocator_.mark_step();
  }
  ASSERT_EQ(allocator_.placement_status().phase, StepLearner::Phase::kPlaced);
  for (std::size_t g : grads) memory.free(g);
  grads.clear();
  allocator_.empty_cache();
  allocator_.check_invariants();
  const CachingAllocator::PlacementStatus status = allocator_.placement_status();
  EXPECT_EQ(status.phase, StepLearner::Phase::kLearning);
  EXPECT_EQ(status.arena_bytes, 0u);
  EXPECT_EQ(allocator_.stats().reserved_bytes.all().current, 0);
}

TEST_F(LearnedPlacementTest, RecordStreamOnALaidOutBlockNeverHandsItOutEarly) {
  Tracked memory(allocator_);
  const TrainingStep step(7, 8);
  std::vector<std::size_t> grads;
  for (int i = 0; i < 4; ++i) {
    step.run(memory, grads);
    allocator_.mark_step();
  }
  ASSERT_EQ(allocator_.placement_status().phase, StepLearner::Phase::kPlaced);
  // A gradient used by a side stream: its free waits for that stream's event, so the layout's
  // range is not free when the next step wants it; the allocator must fall back, not overlap.
  const Stream side = backend_.create_stream();
  allocator_.record_stream(memory.ptr(grads.front()), side);
  for (int i = 0; i < 3; ++i) {
    step.run(memory, grads);
    allocator_.mark_step();
    allocator_.check_invariants();
    memory.check_all();
  }
  backend_.synchronize_device();
  backend_.destroy_stream(side);
}

TEST(LearnedPlacementRandom, InvariantsHoldThroughRandomStepsAndPerturbations) {
  HostBackend backend(device_of(2048 * MiB));
  CachingAllocator allocator(backend, parse_allocator_config("virtual_memory:on,placement:learned"));
  std::mt19937_64 random(17);
  {
    Tracked memory(allocator);
    std::vector<TrainingStep> steps;
    for (std::uint64_t seed = 0; seed < 3; ++seed) steps.emplace_back(100 + seed, 6 + seed * 4);
    std::vector<std::size_t> grads;
    std::vector<std::size_t> extra;
    std::size_t current = 0;
    for (int i = 0; i < 60; ++i) {
      if (random() % 8 == 0) current = random() % steps.size();  // a new shape now and then
      steps[current].run(memory, grads);
      if (random() % 5 == 0) extra.push_back(memory.alloc(MiB + random() % (8 * MiB)));
      if (!extra.empty() && random() % 4 == 0) {
        memory.free(extra.back());
        extra.pop_back();
      }
      if (random() % 3 != 0) allocator.mark_step();
      allocator.check_invariants();
      memory.check_all();
    }
  }
  allocator.check_invariants();
  EXPECT_EQ(allocator.stats().allocated_bytes.all().current, 0);
  // The run both laid out steps and departed.
  EXPECT_GE(allocator.placement_status().layouts_made, 1u);
  EXPECT_GE(allocator.placement_status().departures, 1);
  EXPECT_GT(allocator.placement_status().placed_allocations, 0u);
}

// Marked steps of 40 blocks of about 3 MiB, made and freed.
void run_small_steps(CachingAllocator& allocator, int steps) {
  for (int step = 0; step < steps; ++step) {
    std::vector<void*> blocks;
    for (int i = 0; i < 40; ++i) blocks.push_back(allocator.malloc(3 * MiB + 4096));
    for (void* block : blocks) allocator.free(block);
    allocator.mark_step();
  }
}

TEST(LearnedPlacementMisses, TheArenasFreeMemoryServesARequestTheLayoutDoesNotCover) {
  HostBackend backend(device_of(256 * MiB));
  CachingAllocator allocator(backend, parse_allocator_config("virtual_memory:on,placement:learned"));
  run_small_steps(allocator, 6);
  ASSERT_GT(allocator.placement_status().arena_bytes, 100 * MiB);
  // Between steps the arena is free; a request on another stream needs most of the device.
  const Stream side = backend.create_stream();
  void* big = allocator.malloc(200 * MiB, side);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(allocator.placement_status().departures, 1);  // the layout was given up for it
  allocator.check_invariants();
  allocator.free(big);
  backend.synchronize_device();
  backend.destroy_stream(side);
}

// Frees what it holds when the allocator is short of memory.
struct ReleaseOnPressure final : MemoryPressureHandler {
  CachingAllocator* allocator = nullptr;
  std::vector<void*> held;
  std::size_t relieve_pressure(std::size_t, Stream) noexcept override {
    std::size_t freed = 0;
    for (void* block : held) {
      freed += allocator->block_size(block);
      allocator->free(block);
    }
    held.clear();
    return freed;
  }
};

TEST(LearnedPlacementMisses, UnderPressureTheLayoutIsGivenUpAndLearnedAgainLater) {
  HostBackend backend(device_of(512 * MiB));
  CachingAllocator allocator(backend, parse_allocator_config("virtual_memory:on,placement:learned"));
  const Stream side = backend.create_stream();
  ReleaseOnPressure handler;
  handler.allocator = &allocator;
  std::vector<void*> older;  // freed two steps later: the layout leaves them dynamic
  auto step = [&](bool squeeze) {
    void* a = allocator.malloc(8 * MiB);
    void* b = allocator.malloc(6 * MiB);
    allocator.free(a);
    void* c = allocator.malloc(4 * MiB);
    for (std::size_t i = 0; i < 40; ++i) allocator.free(allocator.malloc(2 * MiB + 4096 * (i % 3)));
    if (squeeze) {
      // Fill the device up to a cap, so that the next request fails until the handler frees.
      allocator.set_limit(static_cast<std::size_t>(allocator.stats().reserved_bytes.all().current));
      testing::QuietLog quiet;
      for (;;) {
        try {
          handler.held.push_back(allocator.malloc(2 * MiB, side));
        } catch (const OutOfMemory&) {
          break;
        }
      }
      allocator.add_pressure_handler(&handler);
    }
    older.push_back(allocator.malloc(10 * MiB));
    if (squeeze) {
      allocator.remove_pressure_handler(&handler);
      allocator.set_limit(AllocatorConfig::kUnlimited);
    }
    if (older.size() > 2) {
      allocator.free(older.front());
      older.erase(older.begin());
    }
    allocator.free(b);
    allocator.free(c);
    allocator.mark_step();
  };
  for (int i = 0; i < 6; ++i) step(false);
  ASSERT_EQ(allocator.placement_status().phase, StepLearner::Phase::kPlaced);
  ASSERT_EQ(allocator.placement_status().departures, 0);
  step(true);
  // Filling the device reached the arena's free memory: the layout went (once), and memory ran
  // short only after that; the request the handler relieved succeeded.
  EXPECT_EQ(allocator.placement_status().departures, 1);
  allocator.check_invariants();
  for (void* block : handler.held) allocator.free(block);
  handler.held.clear();
  for (int i = 0; i < 6; ++i) step(false);
  EXPECT_EQ(allocator.placement_status().phase, StepLearner::Phase::kPlaced);
  allocator.check_invariants();
  for (void* block : older) allocator.free(block);
  backend.synchronize_device();
  backend.destroy_stream(side);
}

TEST(LearnedPlacementMisses, AStepThatBeginsDifferentlyOpensNoArena) {
  HostBackend backend(device_of(1024 * MiB));
  CachingAllocator allocator(backend, parse_allocator_config("virtual_memory:on,placement:learned"));
  auto step = [&](std::size_t first) {
    std::vector<void*> blocks{allocator.malloc(first)};
    for (int i = 0; i < 20; ++i) blocks.push_back(allocator.malloc(5 * MiB + 4096));
    for (void* block : blocks) allocator.free(block);
    allocator.mark_step();
  };
  for (int i = 0; i < 3; ++i) step(7 * MiB);
  ASSERT_EQ(allocator.placement_status().phase, StepLearner::Phase::kPlaced);
  const DeviceStats before = allocator.stats();
  void* other = allocator.malloc(9 * MiB);  // not the layout's first request
  const DeviceStats after = allocator.stats();
  EXPECT_EQ(allocator.placement_status().departures, 1);
  EXPECT_EQ(after.num_unmaps, before.num_unmaps);  // the cache was not given back for nothing
  allocator.free(other);
  allocator.check_invariants();
}

TEST(LearnedPlacementConfig, NeedsThePagedPool) {
  EXPECT_THROW(parse_allocator_config("virtual_memory:off,placement:learned"), LogicError);
  EXPECT_THROW(parse_allocator_config("placement:sometimes"), LogicError);
  EXPECT_EQ(parse_allocator_config("placement:learned").to_string(), "placement:learned");
  HostBackend backend(device_of(64 * MiB));
  CachingAllocator dynamic(backend, parse_allocator_config("virtual_memory:on"));
  EXPECT_FALSE(dynamic.placement_status().enabled);
  dynamic.mark_step();  // cheap and harmless whatever the configuration
}

}  // namespace
}  // namespace stowage
