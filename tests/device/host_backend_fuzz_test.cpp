// A random walk over HostBackend's memory calls, checked against a model after every step.
//
// The model tracks every handle (size, whether released, the byte it was last filled with) and
// every mapping. After each step: check_invariants() holds, used_bytes() equals the model's
// count, and every accessible mapping, through every view, reads its handle's fill byte, which
// catches a mapping at the wrong offset, two handles sharing memory, or a stale view. Rule
// violations are attempted on purpose now and then and must be refused without side effects.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <vector>

#include "base/errors.hpp"
#include "device/host/host_backend.hpp"

namespace stowage {
namespace {

struct ModelHandle {
  std::size_t bytes = 0;
  bool released = false;
  std::size_t mappings = 0;
  std::uint8_t fill = 0;  // 0: never written (new memory reads as zeros on HostBackend)
};

struct ModelMapping {
  std::uint64_t handle = 0;
  std::size_t bytes = 0;
  bool accessible = false;
};

struct ModelReservation {
  std::size_t granules = 0;
  std::map<std::size_t, ModelMapping> mappings;  // by granule index
};

class RandomWalk {
 public:
  explicit RandomWalk(std::uint32_t seed) : random_(seed) {
    HostBackendOptions options;
    options.capacity_bytes = 96 * kMiB;
    options.granularity = 64 * 1024;  // small granules: more mappings per megabyte
    backend_ = std::make_unique<HostBackend>(options);
    g_ = options.granularity;
  }

  void step() {
    switch (pick(9)) {
      case 0: create_handle(); break;
      case 1: release_handle(); break;
      case 2: reserve(); break;
      case 3: release_reservation(); break;
      case 4: case 5: map_somewhere(); break;
      case 6: set_access_somewhere(); break;
      case 7: unmap_somewhere(); break;
      case 8: segment_step(); break;
    }
    check();
  }

  void teardown() {
    for (auto& [base, reservation] : reservations_) {
      for (auto& [granule, mapping] : reservation.mappings) {
        backend_->unmap(address(base, granule), mapping.bytes);
      }
      backend_->release_address_range(reinterpret_cast<void*>(base), reservation.granules * g_);
    }
    for (auto& [id, handle] : handles_) {
      if (!handle.released) backend_->release_physical(PhysicalHandle{id});
    }
    for (auto& [ptr, bytes] : segments_) backend_->free_segment(ptr);
    EXPECT_EQ(backend_->used_bytes(), 0u);
    backend_->check_invariants();
  }

  std::size_t refusals() const { return refusals_; }

 private:
  std::size_t pick(std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(random_); }

  char* address(std::uintptr_t base, std::size_t granule) const {
    return reinterpret_cast<char*>(base + granule * g_);
  }

  void create_handle() {
    const std::size_t bytes = (1 + pick(4)) * g_;
    const auto handle = backend_->try_create_physical(bytes);
    const std::size_t used = model_used();
    if (used + bytes > backend_->properties().total_bytes) {
      EXPECT_FALSE(handle.has_value()) << "capacity was not enforced";
      return;
    }
    ASSERT_TRUE(handle.has_value());
    handles_[handle->value] = ModelHandle{bytes, false, 0, 0};
  }

  void release_handle() {
    if (handles_.empty()) return;
    auto it = std::next(handles_.begin(), static_cast<long>(pick(handles_.size())));
    if (it->second.released) {
      EXPECT_THROW(backend_->release_physical(PhysicalHandle{it->first}), LogicError);
      ++refusals_;
      return;
    }
    backend_->release_physical(PhysicalHandle{it->first});
    it->second.released = true;
    if (it->second.mappings == 0) handles_.erase(it);
  }

  void reserve() {
    if (reservations_.size() >= 6) return;
    const std::size_t granules = 4 + pick(12);
    void* base = backend_->reserve_address_range(granules * g_);
    reservations_[reinterpret_cast<std::uintptr_t>(base)] = ModelReservation{granules, {}};
  }

  void release_reservation() {
    if (reservations_.empty()) return;
    auto it = std::next(reservations_.begin(), static_cast<long>(pick(reservations_.size())));
    void* base = reinterpret_cast<void*>(it->first);
    if (!it->second.mappings.empty()) {
      EXPECT_THROW(backend_->release_address_range(base, it->second.granules * g_), LogicError);
      ++refusals_;
      return;
    }
    backend_->release_address_range(base, it->second.granules * g_);
    reservations_.erase(it);
  }

  // Whether granules [first, first + count) of the reservation are all unmapped.
  static bool free_span(const ModelReservation& reservation, std::size_t first, std::size_t count,
                        std::size_t g) {
    if (first + count > reservation.granules) return false;
    for (const auto& [granule, mapping] : reservation.mappings) {
      const std::size_t end = granule + mapping.bytes / g;
      if (granule < first + count && first < end) return false;
    }
    return true;
  }

  void map_somewhere() {
    if (reservations_.empty() || handles_.empty()) return;
    auto reservation = std::next(reservations_.begin(), static_cast<long>(pick(reservations_.size())));
    auto handle = std::next(handles_.begin(), static_cast<long>(pick(handles_.size())));
    const std::size_t granules = handle->second.bytes / g_;
    const std::size_t first = pick(reservation->second.granules);
    char* at = address(reservation->first, first);
    const bool legal = !handle->second.released &&
                       free_span(reservation->second, first, granules, g_);
    if (!legal) {
      EXPECT_THROW(backend_->map(at, handle->second.bytes, PhysicalHandle{handle->first}), LogicError);
      ++refusals_;
      return;
    }
    backend_->map(at, handle->second.bytes, PhysicalHandle{handle->first});
    reservation->second.mappings[first] = ModelMapping{handle->first, handle->second.bytes, false};
    ++handle->second.mappings;
  }

  void set_access_somewhere() {
    auto found = random_mapping();
    if (!found) return;
    auto& [base, granule, mapping] = *found;
    char* at = address(base, granule);
    if (pick(4) == 0 && mapping.bytes > g_) {
      EXPECT_THROW(backend_->set_access(at, g_), LogicError) << "part of a mapping";
      ++refusals_;
      return;
    }
    backend_->set_access(at, mapping.bytes);
    mapping.accessible = true;
    // Fill through this view; every other view of the handle must show it.
    ModelHandle& handle = handles_.at(mapping.handle);
    handle.fill = static_cast<std::uint8_t>(1 + pick(255));
    std::memset(at, handle.fill, mapping.bytes);
  }

  void unmap_somewhere() {
    auto found = random_mapping();
    if (!found) return;
    auto& [base, granule, mapping] = *found;
    char* at = address(base, granule);
    if (pick(4) == 0 && mapping.bytes > g_) {
      EXPECT_THROW(backend_->unmap(at + g_, mapping.bytes - g_), LogicError);
      ++refusals_;
      return;
    }
    backend_->unmap(at, mapping.bytes);
    auto handle = handles_.find(mapping.handle);
    --handle->second.mappings;
    if (handle->second.released && handle->second.mappings == 0) handles_.erase(handle);
    reservations_.at(base).mappings.erase(granule);
  }

  void segment_step() {
    if (!segments_.empty() && pick(2) == 0) {
      auto it = std::next(segments_.begin(), static_cast<long>(pick(segments_.size())));
      backend_->free_segment(it->first);
      segments_.erase(it);
      return;
    }
    const std::size_t bytes = 512 * (1 + pick(8192));
    void* segment = backend_->try_allocate_segment(bytes);
    if (model_used() + bytes > backend_->properties().total_bytes) {
      EXPECT_EQ(segment, nullptr) << "capacity was not enforced";
      return;
    }
    ASSERT_NE(segment, nullptr);
    segments_[segment] = bytes;
  }

  struct Found {
    std::uintptr_t base;
    std::size_t granule;
    ModelMapping& mapping;
  };
  std::optional<Found> random_mapping() {
    std::vector<std::pair<std::uintptr_t, std::size_t>> all;
    for (auto& [base, reservation] : reservations_) {
      for (auto& [granule, mapping] : reservation.mappings) all.emplace_back(base, granule);
    }
    if (all.empty()) return std::nullopt;
    const auto [base, granule] = all[pick(all.size())];
    return Found{base, granule, reservations_.at(base).mappings.at(granule)};
  }

  std::size_t model_used() const {
    std::size_t used = 0;
    for (const auto& [id, handle] : handles_) used += handle.bytes;
    for (const auto& [ptr, bytes] : segments_) used += bytes;
    return used;
  }

  void check() {
    backend_->check_invariants();
    ASSERT_EQ(backend_->used_bytes(), model_used());
    for (const auto& [base, reservation] : reservations_) {
      for (const auto& [granule, mapping] : reservation.mappings) {
        if (!mapping.accessible) continue;
        const auto* bytes = reinterpret_cast<const std::uint8_t*>(address(base, granule));
        const std::uint8_t fill = handles_.at(mapping.handle).fill;
        // Both ends and the middle: cheap, and a wrong view differs everywhere.
        for (std::size_t offset : {std::size_t{0}, mapping.bytes / 2, mapping.bytes - 1}) {
          ASSERT_EQ(bytes[offset], fill) << "view of handle " << mapping.handle << " at granule "
                                         << granule << " offset " << offset;
        }
      }
    }
  }

  std::mt19937 random_;
  std::unique_ptr<HostBackend> backend_;
  std::size_t g_ = 0;
  std::map<std::uint64_t, ModelHandle> handles_;
  std::map<std::uintptr_t, ModelReservation> reservations_;
  std::map<void*, std::size_t> segments_;
  std::size_t refusals_ = 0;
};

TEST(HostBackendFuzz, RandomWalkKeepsTheModelAndTheInvariants) {
  for (std::uint32_t seed : {1u, 2u, 3u, 4u}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    RandomWalk walk(seed);
    for (int step = 0; step < 1500; ++step) {
      walk.step();
      if (::testing::Test::HasFatalFailure()) return;
    }
    EXPECT_GT(walk.refusals(), 0u) << "the walk never tried a rule violation";
    walk.teardown();
  }
}

}  // namespace
}  // namespace stowage
