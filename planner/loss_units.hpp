// What a loss is a mean over, judged on the example batch (Note [Micro-batches] in
// planner/micro_cut.hpp): fit ran the step's forward on the example and on
// its micro-batches, and each count its tensors offer (rows, entries not -100, masks, per-row
// weights) is a candidate. A candidate holds where, for every cut checked, each span's loss (the
// whole batch's, or consecutive micro-batches' where the whole does not fit) equals its
// micro-batches' losses weighted by their shares of the count, within `tolerance` relative to the
// losses' magnitude (micro-batches holding none of it are left out). The candidates that hold
// are grouped by the shares they give every cut (alike within kSharesAlike): one group names the
// units (its first) and the counts the example cannot tell from them; several groups, or none,
// keep the batch whole, saying why.
//
// Contract: a pure function of its arguments.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace stowage::planner {

inline constexpr double kSharesAlike = 1e-9;  // shares told apart (counts are integers or sums of weights)
inline constexpr double kNoiseMargin = 16;

// The relative difference between a span's loss and its micro-batches' weighted sum taken as
// rounding: `noise`, measured on the step itself (a micro-batch's loss against the loss of the
// same rows repeated to the whole batch's size, equal for any mean whatever its units, so what
// differs is what kernels blocked for another row count and sums taken in another order change),
// kNoiseMargin times over; at least what the loss's own dtype rounds, at most what the least
// precise of `dtypes` (those the forwards made, torch's names: "float32" ...) rounds, float32
// counting as float16 under `tf32` (a GPU's float32 matmuls may keep float16's mantissa); that
// ceiling where nothing was measured. An unknown dtype rounds as float32.
double loss_tolerance(const std::vector<std::string>& dtypes, const std::string& loss_dtype, bool tf32,
                      std::optional<double> noise);

struct LossSpan {
  std::size_t first = 0;  // its first micro-batch
  std::size_t end = 0;    // one past its last
  double loss = 0.0;      // the span's own loss
};

// One cut checked: each micro-batch's loss, and the spans whose losses were measured whole.
struct CutLosses {
  std::vector<double> losses;
  std::vector<LossSpan> spans;
};

struct LossCandidate {
  std::string name;                          // what it counts, as messages say it
  std::vector<std::vector<double>> counts;   // per cut checked, per micro-batch
};

struct UnitsJudgement {
  std::vector<std::size_t> alike;  // the candidates the loss is a mean over, the first naming it; empty: none
  std::string why_not;             // where `alike` is empty
};

// `random_ops`: random draws the forwards made that a cut draws differently ("" where none).
UnitsJudgement judge_loss_units(const std::vector<CutLosses>& cuts, const std::vector<LossCandidate>& candidates,
                                double tolerance, const std::string& random_ops);

// A batch's micro-batches weighted by the units its loss is a mean over.
struct UnitCounts {
  std::string name;            // as messages say it
  std::vector<double> counts;  // per micro-batch
};

struct UnitShares {
  std::vector<double> shares;  // each micro-batch's share of `units`
  std::string why_not;         // where the batch cannot be weighted so ("" where it can)
};

// `units`'s shares; refused (why_not) where the batch holds none, or where a count the example
// batch could not tell from them (`alike`) weighs the micro-batches differently.
UnitShares unit_shares(const UnitCounts& units, const std::vector<UnitCounts>& alike);

}  // namespace stowage::planner
