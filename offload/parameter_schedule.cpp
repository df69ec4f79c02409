#include "offload/parameter_schedule.hpp"

#include <algorithm>
#include <utility>

#include "base/errors.hpp"

namespace stowage::offload {

ParameterSchedule::ParameterSchedule(std::vector<std::size_t> parameter_bytes,
                                     std::vector<std::vector<std::size_t>> unit_parameters, std::size_t prefetch)
    : parameter_bytes_(std::move(parameter_bytes)),
      resident_units_(parameter_bytes_.size(), 0),
      position_(unit_parameters.size(), 0),
      prefetch_(prefetch) {
  units_.reserve(unit_parameters.size());
  for (std::size_t u = 0; u < unit_parameters.size(); ++u) {
    std::vector<std::size_t>& parameters = unit_parameters[u];
    for (const std::size_t p : parameters) {
      STOWAGE_CHECK(p < parameter_bytes_.size(), "unit ", u, " holds parameter ", p, " of ",
                    parameter_bytes_.size());
    }
    std::vector<std::size_t> sorted = parameters;
    std::sort(sorted.begin(), sorted.end());
    STOWAGE_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(), "unit ", u,
                  " lists a parameter twice");
    units_.push_back(Unit{std::move(parameters)});
  }
}

void ParameterSchedule::check_unit(std::size_t unit) const {
  STOWAGE_CHECK(unit < units_.size(), "unit ", unit, " of ", units_.size());
}

void ParameterSchedule::enter(const Unit& unit, ParameterMoves& moves) {
  for (const std::size_t p : unit.parameters) {
    if (resident_units_[p]++ == 0) {
      moves.fill.push_back(p);
      resident_bytes_ += parameter_bytes_[p];
    }
  }
  peak_resident_bytes_ = std::max(peak_resident_bytes_, resident_bytes_);
}

void ParameterSchedule::leave(const Unit& unit, ParameterMoves& moves) {
  for (const std::size_t p : unit.parameters) {
    if (--resident_units_[p] == 0) {
      moves.free.push_back(p);
      resident_bytes_ -= parameter_bytes_[p];
    }
  }
}

std::vector<std::size_t> ParameterSchedule::ahead_of(std::size_t unit, SchedulePass pass) const {
  std::vector<std::size_t> ahead;
  if (!units_[unit].placed) return ahead;
  const std::size_t position = position_[unit];
  for (std::size_t step = 1; step <= prefetch_; ++step) {
    if (pass == SchedulePass::kForward) {
      if (position + step >= order_.size()) break;
      ahead.push_back(order_[position + step]);
    } else {
      if (step > position) break;
      ahead.push_back(order_[position - step]);
    }
  }
  return ahead;
}

ParameterMoves ParameterSchedule::hold(std::size_t unit, SchedulePass pass) {
  check_unit(unit);
  ParameterMoves moves;
  Unit& held = units_[unit];
  if (pass == SchedulePass::kForward && !held.placed) {
    held.placed = true;
    position_[unit] = order_.size();
    order_.push_back(unit);
  }
  if (held.prefetched) {
    held.prefetched = false;  // resident already: a prefetch that came true
  } else if (held.holds == 0) {
    enter(held, moves);
  }
  ++held.holds;
  // The new window first, then the old one dropped: a parameter in both is never freed and filled.
  std::vector<std::size_t> window;
  for (const std::size_t next : ahead_of(unit, pass)) {
    Unit& ahead = units_[next];
    if (ahead.holds > 0) continue;
    window.push_back(next);
    if (!ahead.prefetched) {
      ahead.prefetched = true;
      enter(ahead, moves);
    }
  }
  for (std::size_t u = 0; u < units_.size(); ++u) {
    Unit& other = units_[u];
    if (other.prefetched && std::find(window.begin(), window.end(), u) == window.end()) {
      other.prefetched = false;
      leave(other, moves);
    }
  }
  return moves;
}

ParameterMoves ParameterSchedule::release(std::size_t unit) {
  check_unit(unit);
  Unit& held = units_[unit];
  STOWAGE_CHECK(held.holds > 0, "unit ", unit, " is released but nothing holds it");
  ParameterMoves moves;
  if (--held.holds == 0) leave(held, moves);
  return moves;
}

ParameterMoves ParameterSchedule::release_all() {
  ParameterMoves moves;
  for (Unit& unit : units_) {
    const bool was_resident = unit_resident(unit);
    unit.holds = 0;
    unit.prefetched = false;
    if (was_resident) leave(unit, moves);
  }
  return moves;
}

std::size_t ParameterSchedule::holds(std::size_t unit) const {
  check_unit(unit);
  return units_[unit].holds;
}

bool ParameterSchedule::prefetched(std::size_t unit) const {
  check_unit(unit);
  return units_[unit].prefetched;
}

bool ParameterSchedule::resident(std::size_t parameter) const {
  STOWAGE_CHECK(parameter < parameter_bytes_.size(), "parameter ", parameter, " of ", parameter_bytes_.size());
  return resident_units_[parameter] > 0;
}

std::size_t ParameterSchedule::unit_bytes(std::size_t unit) const {
  check_unit(unit);
  std::size_t bytes = 0;
  for (const std::size_t p : units_[unit].parameters) bytes += parameter_bytes_[p];
  return bytes;
}

void ParameterSchedule::check_invariants() const {
  std::vector<std::size_t> counted(parameter_bytes_.size(), 0);
  std::size_t prefetched = 0;
  for (std::size_t u = 0; u < units_.size(); ++u) {
    const Unit& unit = units_[u];
    STOWAGE_INTERNAL_ASSERT(!(unit.prefetched && unit.holds > 0), "unit ", u, " is held and prefetched");
    prefetched += unit.prefetched ? 1U : 0U;
    if (unit.placed) STOWAGE_INTERNAL_ASSERT(position_[u] < order_.size() && order_[position_[u]] == u, "unit ", u);
    if (!unit_resident(unit)) continue;
    for (const std::size_t p : unit.parameters) ++counted[p];
  }
  STOWAGE_INTERNAL_ASSERT(prefetched <= prefetch_, prefetched, " units prefetched, at most ", prefetch_);
  std::size_t bytes = 0;
  for (std::size_t p = 0; p < counted.size(); ++p) {
    STOWAGE_INTERNAL_ASSERT(counted[p] == resident_units_[p], "parameter ", p);
    if (counted[p] > 0) bytes += parameter_bytes_[p];
  }
  STOWAGE_INTERNAL_ASSERT(bytes == resident_bytes_, bytes, " resident bytes counted, ", resident_bytes_, " kept");
  STOWAGE_INTERNAL_ASSERT(resident_bytes_ <= peak_resident_bytes_);
  std::size_t placed = 0;
  for (const Unit& unit : units_) placed += unit.placed ? 1U : 0U;
  STOWAGE_INTERNAL_ASSERT(placed == order_.size());
}

}  // namespace stowage::offload
