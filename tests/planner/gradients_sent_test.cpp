// A trace with units' gradients sent to the host (planner/gradients_sent): each unit's gradient
// bytes leave `other_bytes` from the op after the last backward use of what it saved, matched by
// module path.
#include "planner/gradients_sent.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace stowage::planner {
namespace {

// Six ops (two forward, four backward); tensors saved in "blocks.0", "blocks.1.mlp" and
// "blocks.10", last used in backward at ops 4, 2 and 3.
LifetimeTrace six_ops() {
  LifetimeTrace trace;
  const std::vector<std::uint64_t> other{5, 5, 50, 60, 70, 80};
  for (std::size_t i = 0; i < other.size(); ++i) {
    trace.ops.push_back({"op", "", i < 2 ? Phase::kForward : Phase::kBackward, 1.0, other[i]});
  }
  const std::vector<std::pair<std::string, std::size_t>> saved{{"blocks.0", 4}, {"blocks.1.mlp", 2}, {"blocks.10", 3}};
  for (const auto& [module, last_use] : saved) {
    SavedTensor tensor;
    tensor.module = module;
    tensor.bytes = 1;
    tensor.first_backward_use = last_use;
    tensor.last_backward_use = last_use;
    trace.tensors.push_back(tensor);
  }
  return trace;
}

std::vector<std::uint64_t> other_bytes(const LifetimeTrace& trace) {
  std::vector<std::uint64_t> out;
  for (const TraceOp& op : trace.ops) out.push_back(op.other_bytes);
  return out;
}

TEST(PlannerGradientsSent, EachUnitsGradientsLeaveOnceBackwardHasPassedIt) {
  // blocks.1's last use is at op 2 ("blocks.10" is another unit), blocks.0's at op 4; blocks.7 saved nothing.
  const LifetimeTrace sent = with_gradients_sent(six_ops(), {{"blocks.1", 20}, {"blocks.0", 30}, {"blocks.7", 9}});
  EXPECT_EQ(other_bytes(sent), (std::vector<std::uint64_t>{5, 5, 50, 40, 50, 30}));
  EXPECT_EQ(other_bytes(with_gradients_sent(six_ops(), {{"blocks.0", 1000}})),
            (std::vector<std::uint64_t>{5, 5, 50, 60, 70, 0}));  // never below 0
  EXPECT_EQ(other_bytes(with_gradients_sent(six_ops(), {})), other_bytes(six_ops()));
}

}  // namespace
}  // namespace stowage::planner
