#include "snapshot/device_events.hpp"

#include <algorithm>
#include <cstddef>
#include <utility>

#include "base/errors.hpp"
#include "snapshot/names.hpp"

namespace stowage::snapshot {

namespace {

std::uint8_t code(Name name) { return *action_code(name); }

void check_columns(const TraceColumnsView& c) {
  STOWAGE_CHECK(c.addr.size() == c.action.size() && c.size.size() == c.action.size() &&
                    c.stream.size() == c.action.size(),
                "the columns action (", c.action.size(), "), addr (", c.addr.size(), "), size (", c.size.size(),
                ") and stream (", c.stream.size(), ") must have one entry an event");
}

// Whether each event is kept, and as what: 0 not, else 1 + its kind.
std::vector<std::uint8_t> kept_kinds(const TraceColumnsView& columns, std::span<const std::int64_t> step_marks) {
  check_columns(columns);
  check_positions(step_marks, static_cast<std::int64_t>(columns.action.size()) - 1, "step_marks", true);
  std::vector<std::uint8_t> kind(columns.action.size(), 0);
  for (std::size_t e = 0; e < kind.size(); ++e) {
    if (columns.action[e] == code(Name::kAlloc)) kind[e] = 1 + kReplayAlloc;
    if (columns.action[e] == code(Name::kFreeCompleted)) kind[e] = 1 + kReplayFree;
  }
  for (const std::int64_t mark : step_marks) {
    const auto e = static_cast<std::size_t>(mark);
    if (columns.action[e] == code(Name::kSnapshot)) kind[e] = 1 + kReplayStepEnd;
  }
  return kind;
}

}  // namespace

std::size_t count_device_events(const TraceColumnsView& columns, std::span<const std::int64_t> step_marks) {
  const std::vector<std::uint8_t> kind = kept_kinds(columns, step_marks);
  return static_cast<std::size_t>(std::count_if(kind.begin(), kind.end(), [](std::uint8_t k) { return k != 0; }));
}

void fill_device_events(const TraceColumnsView& columns, std::span<const std::int64_t> step_marks,
                        std::span<std::uint8_t> kinds, std::span<std::uint64_t> addr, std::span<std::uint64_t> size,
                        std::span<std::uint64_t> stream) {
  const std::vector<std::uint8_t> kind = kept_kinds(columns, step_marks);
  std::size_t k = 0;
  for (std::size_t e = 0; e < kind.size(); ++e) {
    if (kind[e] == 0) continue;
    STOWAGE_CHECK(k < kinds.size() && k < addr.size() && k < size.size() && k < stream.size(),
                  "the device events' outputs are shorter than its events");
    kinds[k] = static_cast<std::uint8_t>(kind[e] - 1);
    const bool real = kinds[k] != kReplayStepEnd;
    addr[k] = real ? columns.addr[e] : 0;
    size[k] = real ? columns.size[e] : 0;
    stream[k] = real ? columns.stream[e] : 0;
    ++k;
  }
}

ReservedPeak reserved_peak(std::span<const std::uint8_t> actions, std::span<const std::uint64_t> addr,
                           std::span<const std::uint64_t> size) {
  STOWAGE_CHECK(addr.size() == actions.size() && size.size() == actions.size(), "the columns action (", actions.size(),
                "), addr (", addr.size(), ") and size (", size.size(), ") must have one entry an event");
  ReservedPeak found;
  Wide running = 0;
  for (std::size_t e = 0; e < actions.size(); ++e) {
    const std::uint8_t action = actions[e];
    const bool grow = action == code(Name::kSegmentAlloc) || action == code(Name::kSegmentMap);
    const bool shrink = action == code(Name::kSegmentFree) || action == code(Name::kSegmentUnmap);
    if (!grow && !shrink) continue;
    // (sizes are read as int64, as numpy reads them: every size is below 2**50)
    const Wide bytes = static_cast<std::int64_t>(size[e]);
    running += grow ? bytes : -bytes;
    found.peak = std::max(found.peak.value_or(0), running);
    if (grow) found.created.push_back(addr[e]);
  }
  std::sort(found.created.begin(), found.created.end());
  found.created.erase(std::unique(found.created.begin(), found.created.end()), found.created.end());
  return found;
}

std::optional<std::int64_t> step_period(std::span<const std::uint8_t> kinds, std::span<const std::uint64_t> sizes) {
  STOWAGE_CHECK(kinds.size() == sizes.size(), "kinds (", kinds.size(), ") and sizes (", sizes.size(),
                ") must have one entry an event");
  std::vector<std::vector<std::uint64_t>> steps;  // the sizes each step allocates, in order
  std::vector<std::uint64_t> current;
  for (std::size_t e = 0; e < kinds.size(); ++e) {
    if (kinds[e] == kReplayAlloc) current.push_back(sizes[e]);
    if (kinds[e] == kReplayStepEnd) steps.push_back(std::exchange(current, {}));
  }
  for (std::size_t period = 1; period <= (steps.size() > 0 ? (steps.size() - 1) / 2 : 0); ++period) {
    bool repeats = true;
    for (std::size_t i = 1; i + period < steps.size() && repeats; ++i) repeats = steps[i] == steps[i + period];
    if (repeats) return static_cast<std::int64_t>(period);
  }
  return std::nullopt;
}

}  // namespace stowage::snapshot
