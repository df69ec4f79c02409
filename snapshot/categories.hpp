// What each allocation of a trace is, inferred from its stacks and lifetime (the rules in
// words: stowage.categories' docstring): the flags of each distinct stack, read off its frames'
// file and function names (stack_flags), and the rules over every position's flags.
//
// Positions are LivePairs' (snapshot/live_pairs.hpp): `flags[p]` the stack flags of position p,
// `stack[index[p]]` its stack (the trace's column: an index into the stacks, or kNoStack /
// kFramesNone), `end[p]` the free that ends an allocation (n: never freed), `step_starts` the
// positions where steps begin (sorted; empty: one step). Pure functions; bad arguments raise
// LogicError naming them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace stowage::snapshot {

// Categories, in stowage.categories.CATEGORIES' order.
enum class Category : std::int8_t { kParameters, kGradients, kStates, kActivations, kInputs, kTemporaries, kUnknown };
inline constexpr const char* kCategoryNames[] = {"parameters", "gradients",   "optimizer states", "activations",
                                                 "inputs",     "temporaries", "unknown"};

// Stack flags, from the frames of one stack.
inline constexpr std::int8_t kPython = 1, kOptimizer = 2, kBackward = 4, kModule = 8, kZeroGrad = 16,
                             kLibraryNn = 32, kLoss = 64;

// A frame's file and function names (str() of its "filename" and "name", "" where missing), UTF-8.
struct FrameNames {
  std::string filename, name;
};

// The flags of one stack (innermost frame first):
// - kLoss: a function named for a loss ("loss", "cross_entropy" or "nll" in its name, any case)
//   below any module call (a frame named _call_impl or _wrapped_call_impl);
// and of its Python frames (a filename ending in .py), kPython and:
// - kOptimizer / kZeroGrad: a frame in torch/optim/ (kZeroGrad where it is zero_grad);
// - kBackward: backward or grad in torch/_tensor.py or torch/autograd/;
// - kModule: nn.Module's call (_call_impl or _wrapped_call_impl in torch/nn/modules/module.py);
// - kLibraryNn: a frame in torch/nn/ or transformers' modeling_utils.py, or a constructor
//   (__init__: a module making its weights).
std::int8_t stack_flags(std::span<const FrameNames> frames);

struct CategoryInputs {
  std::span<const std::int8_t> flags;
  std::span<const std::int32_t> stack;  // the trace's column, by event
  std::span<const std::int64_t> index;
  std::span<const std::uint8_t> is_alloc;
  std::span<const std::int64_t> end;
  std::span<const std::int64_t> step_starts;
};

// Marks autograd's thread's events backward's (in place): an event with frames, none Python's,
// or an allocation without frames, in a trace whose other events have Python frames. Returns
// false (and marks nothing) where the trace has no Python frames to read: fewer than a tenth of
// its allocations have any.
bool mark_autograd_thread(std::span<std::int8_t> flags, std::span<const std::int32_t> stack,
                          std::span<const std::int64_t> index, std::span<const std::uint8_t> is_alloc);

// The category of the allocations at `positions` (stowage.categories.infer), with flags that
// mark_autograd_thread has marked.
std::vector<std::int8_t> infer_categories(const CategoryInputs& inputs, std::span<const std::int64_t> positions);

// Whether each allocation at `positions` is freed in a backward: between a step's first and last
// allocation of `backward_allocs` (sorted).
std::vector<std::uint8_t> freed_in_backward(std::span<const std::int64_t> backward_allocs,
                                            std::span<const std::int64_t> end,
                                            std::span<const std::int64_t> step_starts,
                                            std::span<const std::int64_t> positions);

// The allocations a module's forward made that outlived it (the loop's own code allocated while
// they lived) with no backward between their allocation and their free: a graph autograd kept
// for a backward that never came. `saved` (one entry a position, or empty): only those autograd
// saved; without it, only when they come from at least three distinct stacks (outputs alone
// also outlive a forward).
std::vector<std::int64_t> kept_without_backward(const CategoryInputs& inputs, std::span<const std::uint8_t> saved);

}  // namespace stowage::snapshot
