// ParameterSchedule: which parameters offloaded to the host have a copy on the device, as numbers
// (Note [Parameters off the device]).
//
// Note [Parameters off the device]
// The parameters of each unit (a model's repeated block) live on the host; the device holds a
// copy of a unit's parameters only while the unit runs or is about to. A unit is *held* while
// something needs its copies: its forward running (a hold taken when it starts, dropped when it
// ends), its backward to come (a hold taken when backward reaches the unit's outputs, dropped when
// it has passed the unit's inputs, or at the end of backward), a recomputation inside backward. A
// unit is *prefetched* when a unit before it in the pass's order started: up to `prefetch` units
// ahead, in forward order in forward and in reverse in backward, the order learnt from the forwards
// seen (a unit is placed the first time it runs). A parameter is resident (its copy filled) while
// any unit holding it is held or prefetched; parameters shared by units (tied weights) have one
// copy. Every call returns the parameters whose copies it makes resident (to fill from the host)
// and those it lets go (to free): the caller applies them in that order.
//
// Accounting: resident_bytes() == the sum of the bytes of the parameters held by at least one
// held or prefetched unit; the prefetched units are at most `prefetch`, none of them held.
// The resident bytes are therefore at most the held units' bytes plus `prefetch` units' bytes.
//
// Contract: not thread-safe (the caller's lock: one training thread drives it). Numbers only:
// units and parameters are indices given at construction. Misuse (an unknown unit, releasing a
// unit nobody holds) throws LogicError and changes nothing.
#pragma once

#include <cstddef>
#include <vector>

namespace stowage::offload {

enum class SchedulePass { kForward, kBackward };

struct ParameterMoves {
  std::vector<std::size_t> fill;  // parameters whose copies become resident, the unit's first
  std::vector<std::size_t> free;  // parameters whose copies are let go
};

class ParameterSchedule {
 public:
  // `parameter_bytes[p]`: the bytes of parameter p's copy; `unit_parameters[u]`: the parameters
  // unit u holds (each once; a parameter may be in several units).
  ParameterSchedule(std::vector<std::size_t> parameter_bytes, std::vector<std::vector<std::size_t>> unit_parameters,
                    std::size_t prefetch);

  // `unit` starts running in `pass`: one more hold on it, and the next `prefetch` units of the
  // pass's order prefetched in place of those prefetched before.
  ParameterMoves hold(std::size_t unit, SchedulePass pass);
  // One hold on `unit` dropped.
  ParameterMoves release(std::size_t unit);
  // Every hold and prefetch dropped (the end of backward, or a failed step).
  ParameterMoves release_all();

  std::size_t holds(std::size_t unit) const;
  bool prefetched(std::size_t unit) const;
  bool resident(std::size_t parameter) const;
  std::size_t resident_bytes() const noexcept { return resident_bytes_; }
  std::size_t peak_resident_bytes() const noexcept { return peak_resident_bytes_; }
  // The bytes of one unit's parameters.
  std::size_t unit_bytes(std::size_t unit) const;
  // The units in the order their forwards were first seen.
  const std::vector<std::size_t>& order() const noexcept { return order_; }
  std::size_t unit_count() const noexcept { return units_.size(); }
  std::size_t parameter_count() const noexcept { return parameter_bytes_.size(); }
  std::size_t prefetch() const noexcept { return prefetch_; }

  // Throws InternalError if the accounting identity or the prefetch bound does not hold.
  void check_invariants() const;

 private:
  struct Unit {
    std::vector<std::size_t> parameters;
    std::size_t holds = 0;
    bool prefetched = false;
    bool placed = false;  // in order_
  };

  bool unit_resident(const Unit& unit) const { return unit.holds > 0 || unit.prefetched; }
  // Counts `unit` resident (or no longer) for each of its parameters, recording the moves.
  void enter(const Unit& unit, ParameterMoves& moves);
  void leave(const Unit& unit, ParameterMoves& moves);
  // The `prefetch_` units after `unit` in `pass`'s order.
  std::vector<std::size_t> ahead_of(std::size_t unit, SchedulePass pass) const;
  void check_unit(std::size_t unit) const;

  std::vector<std::size_t> parameter_bytes_;
  std::vector<std::size_t> resident_units_;  // per parameter: its units that are resident
  std::vector<Unit> units_;
  std::vector<std::size_t> order_;
  std::vector<std::size_t> position_;  // per unit: its index in order_ (valid when placed)
  std::size_t prefetch_;
  std::size_t resident_bytes_ = 0;
  std::size_t peak_resident_bytes_ = 0;
};

}  // namespace stowage::offload
