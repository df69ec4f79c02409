// The planner's files as schemas with bounds (planner/schema.hpp): a lifetime trace
// ("stowage-lifetimes"), a step recorded at several sizes ("stowage-sized-lifetimes") and a plan
// ("stowage-plan"), read from the documents json.loads made (Note [Planner files]).
//
// Note [Planner files]
// Every reader of them checks a document here first, before anything is built from it: a file
// from elsewhere (a lifetime trace file passed around a team) is refused with the field, the value and the
// bound (the caller adds the file: Python's InputError), never met later as a traceback or a
// solve that does not end. The bounds, each with its reason:
//
// - bytes: kMaxBytes for one tensor (1 PiB, as the snapshot reader's MAX_SIZE: beyond any device)
//   and kMaxTotalBytes for memory in use and for all saved tensors together (64 PiB), so that
//   every sum the simulator makes stays exact in 64 bits;
// - times: kMaxMs an op (a day: a step is never longer), so the step's sum stays finite;
// - counts: kMaxOps ops, kMaxTensors tensors, kMaxRegions regions (far beyond a real step's
//   thousands; the file's size bounds them first), kMaxText characters a name;
// - indices: within the document's own lists (an op, a tensor, a region the trace has);
// - the cost model: bandwidths from kMinBytesPerMs to kMaxBytesPerMs, and a prefetch depth no
//   deeper than the trace has saved tensors (each buffer is one: a deeper one is the same plan,
//   and the solver tries each depth);
// - sizes (a sized trace): kMaxSizes sizes of kMinPoints to kMaxPoints points each, at most
//   kMaxGridPoints points in the grid (checked before the grid is built), each size up to
//   kMaxSizeValue;
// - a plan: a budget of 1 byte to kMaxTotalBytes, one decision per saved tensor, each one the
//   runtime can apply to it.
//
// The format and version are checked first, so that another file is named as such. Then the
// schema, then the rules across fields (each op's place in its region, the saved bytes in all, a
// recomputable tensor's region), then the trace's own rules (LifetimeTrace::validate): the first
// refusal is the one returned. The walk is bounded by the schema's depth and linear in the
// document.
//
// Contract: pure functions of the document; each reads it through the view it is given.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "planner/document.hpp"
#include "planner/lifetime_trace.hpp"
#include "planner/plan.hpp"
#include "planner/schema.hpp"
#include "planner/sized_trace.hpp"

namespace stowage::planner {

inline constexpr std::string_view kLifetimesFormat = "stowage-lifetimes";
inline constexpr std::string_view kSizedFormat = "stowage-sized-lifetimes";
inline constexpr std::string_view kPlanFormat = "stowage-plan";
inline constexpr std::int64_t kFormatVersion = 1;

inline constexpr double kMaxMs = 86'400'000.0;
inline constexpr std::int64_t kMaxOps = 5'000'000;
inline constexpr std::int64_t kMaxTensors = 5'000'000;
inline constexpr std::int64_t kMaxRegions = 1'000'000;
inline constexpr std::int64_t kMaxText = 4096;
inline constexpr std::int64_t kMaxCalls = std::int64_t{1} << 31;
inline constexpr double kMinBytesPerMs = 1e3;   // 1 MB/s
inline constexpr double kMaxBytesPerMs = 1e12;  // 1 PB/s
// What a trace of fewer saved tensors may still name (the calibration's).
inline constexpr std::int64_t kDefaultPrefetchDepth = 2;
inline constexpr std::int64_t kMaxSizes = 8;
inline constexpr std::int64_t kMinPoints = 2;
inline constexpr std::int64_t kMaxPoints = 8;
inline constexpr std::int64_t kMaxGridPoints = 256;
inline constexpr std::int64_t kMaxSizeValue = std::int64_t{1} << 31;

// A document read: what it holds, or why it was refused (then `traces` is empty).
struct ReadDocument {
  std::vector<LifetimeTrace> traces;  // a lifetime trace's one, a sized one's per grid point, a plan's one
  Plan decisions;                     // a plan's
  std::optional<Refusal> refusal;
};

// A lifetime trace document, checked whole and built; `field`: where it sits in a larger one (a
// sized trace's or a plan's: its format is then not checked, the larger one's was).
ReadDocument read_lifetimes(DocumentView& view, DocNode document, const std::string& field = {});

// A sized trace document: its format, sizes and grid, then each lifetime trace as read_lifetimes
// reads it ("profiles[3]"); whether the grid's steps are one step is the caller's to check.
ReadDocument read_sized(DocumentView& view, DocNode document);

// A plan document: its format, budget and decisions, its lifetime trace ("profile"), then the
// decisions against the trace's tensors (one each, each one the runtime can apply).
ReadDocument read_plan(DocumentView& view, DocNode document);

// The refusal for a cost model outside its bounds (a lifetime trace's, or one given to solve), at field
// "cost"; `tensors` the trace's saved tensors (the deepest prefetch).
std::optional<Refusal> check_cost(DocumentView& view, DocNode cost, std::size_t tensors);

// Why the runtime cannot apply `decision` to a tensor, if it cannot.
std::optional<std::string> decision_problem(Decision decision, bool recomputable, bool offloadable,
                                            std::int32_t region);

// Why the runtime cannot apply `decisions` to `trace`'s tensors, naming the first tensor it
// cannot apply its decision to: one decision per tensor, each one the runtime can apply, in a
// region the trace has. A plan is checked so once, when it is made.
std::optional<std::string> plan_problem(const LifetimeTrace& trace, const Plan& decisions);

}  // namespace stowage::planner
