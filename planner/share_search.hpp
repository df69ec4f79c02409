// The search behind stowage.fit's choice (Note [Choosing a share]): which share of the
// optimizer's states to keep on the device, and how many rows a micro-batch takes.
//
// Note [Choosing a share]
// For each share (the largest first) fit weighs micro-batch sizes: the size asked for, or else
// the largest that fits (bisecting over the number of micro-batches, since a micro-batch's peak
// grows with its rows) and up to `extra_cuts` halvings of it, down to the first whose plan keeps
// everything (a smaller one only adds steps); the whole batch is listed too where it does not
// fit, so that the table says why. Each option is solved once, by the caller's `evaluate` (the
// planner under the memory the share leaves, with the step recorded at those rows). Of the
// feasible options the fastest predicted step wins, where predictions within `tie` of it are
// not told apart and the parameters on the device (the least changed: Note [Weighing fit's
// options]), then the fewest micro-batches (the most rows), then the most states on the device,
// win. Ranks that train in step take a choice feasible on every
// rank, timed by its slowest rank.
//
// Contract: pure functions but for the calls to `evaluate`, made at most once per (share, rows)
// and in the order the options are listed.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

namespace stowage::planner {

struct ShareChoice {
  double fraction = 1.0;        // share of the states kept on the device
  std::int64_t micro_rows = 0;  // rows of one micro-batch
  bool parameters_on_host = false;  // the blocks' parameters live on the host between their uses

  friend bool operator==(const ShareChoice&, const ShareChoice&) = default;
};

struct WeighedOption {
  bool feasible = false;
  bool keeps_everything = false;  // its plan neither recomputes nor offloads
  double step_ms = 0.0;           // predicted; read only when feasible
};

// Evaluates one option: (share, rows of a micro-batch, micro-batches the batch runs as).
using EvaluateOption = std::function<WeighedOption(double, std::int64_t, std::int64_t)>;

struct ShareSearch {
  std::int64_t rows = 0;                    // the batch's rows
  std::optional<std::int64_t> micro_rows;   // asked for; nullopt: fit chooses
  std::int64_t smallest = 1;                // the fewest rows a micro-batch may take
  int extra_cuts = 3;
};

// The options weighed, in the order they are listed (each solved once).
std::vector<ShareChoice> weigh_shares(const std::vector<double>& fractions, const ShareSearch& search,
                                      const EvaluateOption& evaluate);

using TimedChoices = std::vector<std::pair<ShareChoice, double>>;

// The choice to take from the feasible choices' predicted step times; nullopt when none.
// `as_given`, where the step fits as given (every state on the device, the whole batch at once, a
// plan that neither recomputes nor offloads), is taken whatever the others' times: fit changes
// nothing where nothing needs changing (a CPU's for-loop update timed slower than the host
// kernel's would otherwise move the states for a few milliseconds that a GPU's fused update does
// not lose, and a noisy timing would decide).
std::optional<ShareChoice> pick_choice(const TimedChoices& step_ms, double tie,
                                       const std::optional<ShareChoice>& as_given = std::nullopt);

// One choice for ranks training in step: feasible on every rank, timed by its slowest.
std::optional<ShareChoice> agree_choice(const std::vector<TimedChoices>& per_rank, double tie);

}  // namespace stowage::planner
