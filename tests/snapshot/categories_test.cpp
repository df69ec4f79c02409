// snapshot/categories and snapshot/recompute_estimate: a small training step's allocations
// categorised by the rules, a trace without Python frames left unknown, autograd's thread's
// events marked backward's; checkpointing on a hand-made block and, on random traces, changing
// nothing where there is nothing to checkpoint.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "base/errors.hpp"
#include "snapshot/categories.hpp"
#include "snapshot/recompute_estimate.hpp"

namespace stowage::snapshot {
namespace {

constexpr auto kP = kPython;
std::int8_t f(int flags) { return static_cast<std::int8_t>(flags); }

TEST(Categories, ATrainingStepsAllocationsAreWhatTheRulesSay) {
  // position: what it is (flags; freed at)
  // 0 weight        (nn, python; never freed)         -> parameters
  // 1 input batch   (loop; freed at 9, after backward) -> inputs
  // 2 activation    (module; freed at 6 in backward)  -> activations
  // 3 temporary     (module; freed at 4 in forward)   -> temporaries
  // 4 free of 3
  // 5 gradient      (backward; never freed)           -> gradients
  // 6 free of 2     (backward)
  // 7 Adam state    (optimizer; never freed)          -> optimizer states
  // 8 gradient      (backward; freed at 10 by the optimizer) -> gradients
  // 9 free of 1, 10 free of 8 (optimizer)
  const std::vector<std::int8_t> flags{f(kP | kLibraryNn), f(kP),      f(kP | kModule), f(kP | kModule),
                                       f(kP | kModule),    f(kP | kBackward), f(kP | kBackward), f(kP | kOptimizer),
                                       f(kP | kBackward),  f(kP),      f(kP | kOptimizer)};
  const std::vector<std::uint8_t> is_alloc{1, 1, 1, 1, 0, 1, 0, 1, 1, 0, 0};
  const std::vector<std::int64_t> end{11, 9, 6, 4, 11, 11, 11, 11, 10, 11, 11};
  std::vector<std::int64_t> index(11);
  std::vector<std::int32_t> stack(11);
  for (std::size_t p = 0; p < 11; ++p) {
    index[p] = static_cast<std::int64_t>(p);
    stack[p] = static_cast<std::int32_t>(p);  // every event its own stack: the frees' frames tell
  }
  const CategoryInputs inputs{flags, stack, index, is_alloc, end, {}};
  const std::vector<std::int64_t> allocs{0, 1, 2, 3, 5, 7, 8};
  const auto c = [](Category category) { return static_cast<std::int8_t>(category); };
  EXPECT_EQ(infer_categories(inputs, allocs),
            (std::vector<std::int8_t>{c(Category::kParameters), c(Category::kInputs), c(Category::kActivations),
                                      c(Category::kTemporaries), c(Category::kGradients), c(Category::kStates),
                                      c(Category::kGradients)}));
  EXPECT_THROW(infer_categories(inputs, std::vector<std::int64_t>{11}), LogicError);
}

TEST(Categories, AutogradsThreadIsMarkedBackwardsAndATraceWithoutPythonFramesIsNot) {
  std::vector<std::int8_t> flags{f(kP), f(0), f(0), f(kP)};
  const std::vector<std::int32_t> stack{0, 1, -1, -1};
  const std::vector<std::int64_t> index{0, 1, 2, 3};
  const std::vector<std::uint8_t> is_alloc{1, 1, 1, 0};
  ASSERT_TRUE(mark_autograd_thread(flags, stack, index, is_alloc));
  EXPECT_EQ(flags, (std::vector<std::int8_t>{f(kP), f(kP | kBackward), f(kP | kBackward), f(kP)}));
  std::vector<std::int8_t> none(4, 0);
  EXPECT_FALSE(mark_autograd_thread(none, stack, index, is_alloc));
  EXPECT_EQ(none, std::vector<std::int8_t>(4, 0));
}

TEST(Categories, AForwardsGraphKeptWithoutABackwardIsFoundFromThreeStacksOrWhereSaved) {
  // A forward (module) makes 0, 1, 2 at stacks 0, 1, 2; the loop allocates at 3; they are freed at
  // 4, 5, 6 with no backward between. Then 7 (module) is freed at 9 after a backward at 8.
  const std::vector<std::int8_t> flags{f(kP | kModule), f(kP | kModule), f(kP | kModule), f(kP),
                                       f(kP), f(kP), f(kP), f(kP | kModule), f(kP | kBackward), f(kP)};
  const std::vector<std::uint8_t> is_alloc{1, 1, 1, 1, 0, 0, 0, 1, 1, 0};
  const std::vector<std::int64_t> end{4, 5, 6, 10, 10, 10, 10, 9, 10, 10};
  std::vector<std::int64_t> index(10);
  std::vector<std::int32_t> stack{0, 1, 2, 3, 4, 5, 6, 0, 7, 8};
  for (std::size_t p = 0; p < 10; ++p) index[p] = static_cast<std::int64_t>(p);
  const CategoryInputs inputs{flags, stack, index, is_alloc, end, {}};
  EXPECT_EQ(kept_without_backward(inputs, {}), (std::vector<std::int64_t>{0, 1, 2}));
  const std::vector<std::uint8_t> saved{0, 1, 0, 0, 0, 0, 0, 1, 0, 0};
  EXPECT_EQ(kept_without_backward(inputs, saved), (std::vector<std::int64_t>{1}));
  stack[2] = 1;  // two stacks alone: outputs, as likely as a kept graph
  const CategoryInputs fewer{flags, stack, index, is_alloc, end, {}};
  EXPECT_TRUE(kept_without_backward(fewer, {}).empty());
}

TEST(Categories, AStacksFlagsAreReadOffItsFramesFileAndFunctionNames) {
  const auto flags = [](std::vector<FrameNames> frames) { return stack_flags(frames); };
  EXPECT_EQ(flags({}), 0);
  EXPECT_EQ(flags({{"train.py", "main"}}), kPython);
  EXPECT_EQ(flags({{"<built-in>", "step"}}), 0);  // not Python's
  EXPECT_EQ(flags({{"/x/torch/optim/adamw.py", "step"}}), kPython | kOptimizer);
  EXPECT_EQ(flags({{"/x/torch/optim/optimizer.py", "zero_grad"}}), kPython | kZeroGrad);
  EXPECT_EQ(flags({{"/x/torch/_tensor.py", "backward"}}), kPython | kBackward);
  EXPECT_EQ(flags({{"/x/torch/autograd/__init__.py", "grad"}}), kPython | kBackward);
  EXPECT_EQ(flags({{"/x/torch/nn/modules/module.py", "_call_impl"}}), kPython | kModule | kLibraryNn);
  EXPECT_EQ(flags({{"/x/transformers/modeling_utils.py", "f"}}), kPython | kLibraryNn);
  EXPECT_EQ(flags({{"model.py", "__init__"}}), kPython | kLibraryNn);
  // A loss's frame counts below any module call, its name in any case, Python's or not.
  EXPECT_EQ(flags({{"train.py", "Cross_Entropy_Loss"}}), kPython | kLoss);
  EXPECT_EQ(flags({{"<c>", "NLL"}}), kLoss);
  EXPECT_EQ(flags({{"/x/torch/nn/modules/module.py", "_wrapped_call_impl"}, {"train.py", "loss_fn"}}),
            kPython | kModule | kLibraryNn);
}

TEST(RecomputeEstimate, ACheckpointedBlockKeepsItsOutputAndBringsItsActivationsBackInBackward) {
  // Block 0 makes a (activation, 100), b (its output, 10); backward frees a at 4, b at 5.
  //   0 alloc a   1 alloc b   2 alloc head (no block, 50)   3 free head   4 free a   5 free b
  const std::vector<std::uint8_t> is_alloc{1, 1, 1, 0, 0, 0};
  const std::vector<std::int64_t> end{4, 5, 3, 6, 6, 6}, size{100, 10, 50, 50, 100, 10};
  const std::vector<std::int64_t> own{100, 10, 50, -50, -100, -10}, block{0, 0, -1, -1, -1, -1};
  const std::vector<std::int64_t> live{100, 110, 160, 110, 10, 0};
  const std::vector<std::int64_t> activations{0};
  // a is not kept through forward (0, 10, 60 live), and is back at 3 with, for an instant, the
  // rest of its block's forward peak (110 - 100 = 10): 10 + 100 + 10 = 120.
  EXPECT_TRUE(checkpointed_peak(LiveSeries(std::span<const std::int64_t>(live)), is_alloc, end, size, own,
                                activations, block) == 120);
}

TEST(RecomputeEstimate, RandomTracesWithoutBlocksOrActivationsKeepTheirPeak) {
  std::mt19937_64 rng(3);
  for (int round = 0; round < 100; ++round) {
    const std::size_t n = 1 + rng() % 80;
    std::vector<std::uint8_t> is_alloc(n);
    std::vector<std::int64_t> end(n, static_cast<std::int64_t>(n)), size(n), own(n), live(n), block(n);
    std::vector<std::size_t> open;
    std::int64_t running = 0;
    for (std::size_t p = 0; p < n; ++p) {
      block[p] = static_cast<std::int64_t>(rng() % 3) - 1;
      if (open.empty() || rng() % 2 == 0) {
        is_alloc[p] = 1;
        size[p] = static_cast<std::int64_t>(1 + rng() % 100);
        own[p] = size[p];
        open.push_back(p);
      } else {
        const std::size_t k = open[rng() % open.size()];
        open.erase(std::find(open.begin(), open.end(), k));
        end[k] = static_cast<std::int64_t>(p);
        size[p] = size[k];
        own[p] = -size[k];
      }
      running += own[p];
      live[p] = running;
    }
    const Wide peak = *std::max_element(live.begin(), live.end());
    const LiveSeries series{std::span<const std::int64_t>(live)};
    EXPECT_TRUE(checkpointed_peak(series, is_alloc, end, size, own, {}, block) == peak) << round;
    const std::vector<std::int64_t> outside(n, -1);
    std::vector<std::int64_t> all;
    for (std::size_t p = 0; p < n; ++p) {
      if (is_alloc[p] != 0) all.push_back(static_cast<std::int64_t>(p));
    }
    EXPECT_TRUE(checkpointed_peak(series, is_alloc, end, size, own, all, outside) == peak) << round;
    EXPECT_TRUE(checkpointed_peak(series, is_alloc, end, size, own, all, block) <= peak + 100 * static_cast<Wide>(n))
        << round;
  }
}

TEST(RecomputeEstimate, BlocksAreTheOutermostNumberedModulesWithModulesInside) {
  const std::vector<std::string> paths = {"GPT",          "GPT.h",       "GPT.h.0",   "GPT.h.0.attn", "GPT.h.1",
                                          "GPT.h.1.mlp",  "GPT.conv1",   "GPT.head3", "GPT.h.2",      "Net.layer1\n.x"};
  const PathBlocks found = block_of_paths(paths);
  EXPECT_EQ(found.blocks, (std::vector<std::string>{"GPT.h.0", "GPT.h.1", "Net.layer1\n"}));
  // GPT.h.2 and GPT.head3 have no modules inside: no blocks; the root never is one.
  EXPECT_EQ(found.block_of_path, (std::vector<std::int64_t>{-1, -1, 0, 0, 1, 1, -1, -1, -1, 2}));
}

TEST(RecomputeEstimate, RandomPathsGetBlocksThatArePrefixesOfThemWithModulesInside) {
  std::mt19937_64 rng(17);
  const std::vector<std::string> names = {"h", "3", "layer1", "", "x\n", "blocks", "10", "\xff", "a1b"};
  for (int round = 0; round < 500; ++round) {
    std::vector<std::string> paths;
    for (std::size_t p = rng() % 12; p > 0; --p) {
      std::string path = "M";
      for (std::size_t d = rng() % 5; d > 0; --d) path += "." + names[rng() % names.size()];
      paths.push_back(path);
    }
    const PathBlocks found = block_of_paths(paths);
    ASSERT_EQ(found.block_of_path.size(), paths.size());
    for (std::size_t p = 0; p < paths.size(); ++p) {
      const std::int64_t b = found.block_of_path[p];
      if (b < 0) continue;
      ASSERT_LT(static_cast<std::size_t>(b), found.blocks.size());
      const std::string& block = found.blocks[static_cast<std::size_t>(b)];
      ASSERT_EQ(paths[p].rfind(block, 0), 0U);  // a prefix, ending at a dot or the path's end
      ASSERT_TRUE(paths[p].size() == block.size() || paths[p][block.size()] == '.');
      ASSERT_TRUE(std::any_of(paths.begin(), paths.end(), [&](const std::string& q) {
        return q.size() > block.size() && q.rfind(block + ".", 0) == 0;
      }));  // with modules inside
    }
  }
}

}  // namespace
}  // namespace stowage::snapshot
