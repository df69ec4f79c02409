// Replays a plan over a lifetime trace: the step's peak device memory and its time, with the
// copies on their links and the recomputation in backward (Note [Simulating a plan]).
//
// Note [Simulating a plan]
// Forward runs its ops back to back: nothing in a plan slows it. An offloaded tensor's copy out
// starts when its producer ends, behind the offloads before it on the device-to-host link, and its
// device memory is freed at the end of the op during which both the copy and the tensor's last
// forward use are done. Backward visits its ops in order and brings offloaded tensors back as the
// offloader does: each buffer an op needs is asked for, its reload starting then unless it came
// back ahead, and each ask brings back ahead the buffers offloaded before it (made before it) that
// are still out, until `prefetch_depth` are back or coming and not yet used; the last
// `prefetch_depth` offloaded are asked for when backward starts. Under a ceiling (the allocated
// ceiling a plan's step runs under: its budget) a buffer comes back ahead only when the memory at
// the op, with it, stays within the ceiling; the first that does not ends the prefetch, as the
// offloader's does (it prefetches only into room under the ceiling). A reload runs behind those
// before it on the host-to-device link and holds its memory from the op where it is issued; the op
// that needs it waits for it (a stall). An offload still running when its reload would be issued
// never freed the tensor: it stays resident and comes back at no cost. A recomputed tensor is freed
// after its last forward use and made again just before the first backward op that needs it, or
// that needs a recomputed tensor made from it (the chain), each at most once (a tensor of a
// checkpoint region no later than the first backward op that needs any tensor of the region:
// Note [Lifetime trace]): its recompute time is added before that op and it is live from there to
// its last backward use. Its inputs must be on the device by then, so an offloaded input's reload
// is due at that op. Memory at an op is its `other_bytes` plus every saved tensor live at any time
// during it; the peak is the largest. The step's time is the end of its last op.
//
// Contract: the simulator keeps references to the trace and the cost model, which must outlive
// it; simulate() reuses buffers of its own, so one simulator serves one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "planner/cost_model.hpp"
#include "planner/lifetime_trace.hpp"
#include "planner/plan.hpp"

namespace stowage::planner {

struct Simulation {
  std::uint64_t peak_bytes = 0;
  std::size_t peak_op = 0;  // the first op at the peak
  double step_ms = 0;
  double recompute_ms = 0;  // time spent making tensors again
  double stall_ms = 0;      // time backward waited for reloads
  std::vector<std::uint64_t> bytes_at_op;
};

class Simulator {
 public:
  static constexpr std::uint64_t kNoCeiling = UINT64_MAX;

  // Validates both (LogicError on a broken rule). `ceiling`: the allocated ceiling the step runs
  // under, which bounds what comes back ahead of use.
  Simulator(const LifetimeTrace& trace, const CostModel& cost, std::uint64_t ceiling = kNoCeiling);

  // Throws LogicError when `plan` does not have one decision per saved tensor, offloads or
  // recomputes a tensor that cannot be, or both recomputes and offloads in one region.
  Simulation simulate(const Plan& plan);

  const LifetimeTrace& trace() const noexcept { return trace_; }
  const CostModel& cost() const noexcept { return cost_; }
  std::uint64_t ceiling() const noexcept { return ceiling_; }
  std::size_t first_backward_op() const noexcept { return first_backward_; }  // ops.size() if none
  // The op before which `s`, recomputed, is made again (chains aside).
  std::size_t remade_before(const SavedTensor& s) const;

 private:
  void check(const Plan& plan) const;
  void schedule_recompute(const Plan& plan);
  void schedule_offloads(const Plan& plan);
  void run_backward(Simulation& result);
  void add_live(std::size_t first, std::size_t last, std::uint64_t bytes);
  void advance_live_to(std::size_t op);
  bool fits_ahead(std::size_t tensor, std::size_t op) const;
  std::size_t op_ending_after(double time, std::size_t from, std::size_t until) const;
  void issue_reload(std::size_t tensor, std::size_t op, double time, double& link_free);

  const LifetimeTrace& trace_;
  const CostModel& cost_;
  std::uint64_t ceiling_;
  std::size_t first_backward_ = 0;
  std::vector<double> unstalled_end_;  // each op's end if nothing stalls (forward's are exact)
  // Each op's time and other bytes, apart from its names: the loops over ops read only these.
  std::vector<double> duration_ms_;
  std::vector<std::uint64_t> other_bytes_;
  std::vector<double> op_end_;         // each op's end as this simulation runs it
  std::vector<std::size_t> return_order_;  // offloaded tensors, last made first, rebuilt per plan
  std::vector<std::size_t> region_first_need_;  // per region: its first backward op needing a tensor
  // Per tensor, rebuilt by each simulate():
  // First op that needs it in backward (recompute chains included); a recomputed tensor is made
  // again just before it.
  std::vector<std::size_t> need_at_;
  std::vector<double> out_done_;        // offloaded: when its offload completes
  std::vector<double> in_done_;         // offloaded: when its reload completes (0: stayed resident)
  std::vector<double> recompute_before_;  // per op: the recomputation that runs just before it
  std::vector<std::int64_t> live_delta_;  // a difference array of live bytes over the ops
  // While backward runs: the op it is at, and the live bytes there (live_delta_ summed to it).
  std::size_t live_op_ = SIZE_MAX;
  std::int64_t live_at_op_ = 0;
};

}  // namespace stowage::planner
