// What each allocation of a trace is, inferred from its stacks and lifetime, as stock PyTorch's
// snapshots allow: parameters, gradients, optimizer states, activations, inputs, temporaries, or
// unknown. The flags of each distinct stack are read off its frames' file and function names
// (stack_flags), and the rules run over every position's flags. The rules read the Python frames
// of the allocation and of the free that ends it (torch records both), and whether it outlives
// its step:
// - made under torch.optim (its frames pass through torch/optim/): optimizer states when it
//   outlives the optimizer's step (never freed, or freed in a later step), else temporaries;
// - made in backward (a frame of Tensor.backward or torch.autograd.backward/grad): gradients when
//   it outlives backward (freed by the optimizer, zero_grad, or not at all), else temporaries;
// - made outside both, inside a module's forward (a frame of nn.Module's call): activations when
//   backward frees it, temporaries when the forward does; one never freed, made before any
//   backward, is a parameter (or buffer);
// - made outside any module's forward: made before any backward and freed after the last (or
//   never), in torch.nn or a constructor (a module's __init__, `.to()`): parameters (or
//   buffers); else (the loop's own lines) inputs when it lives into backward or beyond,
//   temporaries otherwise;
// - on a GPU the backward runs on autograd's own thread, whose events have no Python frames: in a
//   trace whose other events have them, an allocation without them is backward's, and a free
//   without them is placed by where it falls (in backward between a step's first and last
//   backward allocation);
// - in a trace without Python frames at all: unknown.
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

// Categories, in the order stowage._core.category_names gives them.
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

// The category of the allocations at `positions`, with flags that
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
