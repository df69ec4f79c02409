#include "snapshot/categories.hpp"

#include <algorithm>
#include <cstddef>
#include <string_view>
#include <utility>

#include "base/errors.hpp"
#include "snapshot/live_series.hpp"

namespace stowage::snapshot {

namespace {

std::size_t at(std::int64_t position) { return static_cast<std::size_t>(position); }

using Spans = std::vector<std::pair<std::int64_t, std::int64_t>>;  // sorted, disjoint [first, last]

// [first, last] backward allocation of each step.
Spans backward_spans(std::span<const std::int64_t> backwards, std::span<const std::int64_t> step_starts) {
  Spans spans;
  std::size_t step = 0;
  NumpySearch step_of(step_starts, true);
  for (std::size_t k = 0; k < backwards.size(); ++k) {
    const std::size_t its_step = step_of.next(backwards[k]);
    if (k == 0 || its_step != step) {
      spans.emplace_back(backwards[k], backwards[k]);
    } else {
      spans.back().second = backwards[k];
    }
    step = its_step;
  }
  return spans;
}

bool inside(const Spans& spans, std::int64_t position) {
  const auto after = std::upper_bound(spans.begin(), spans.end(), position,
                                      [](std::int64_t value, const auto& span) { return value < span.first; });
  return after != spans.begin() && position <= std::prev(after)->second;
}

// What the rules read of one allocation.
struct Seen {
  std::int8_t own = 0;         // its flags
  std::int8_t free_flags = 0;  // its free's (placed by where it falls when they tell nothing)
  bool freed = false;
  bool later_step = false;     // freed in a later step than its own
  bool before_backward = false, ends_after_backward = false, ends_after_last_backward = false;
};

Category rules(const Seen& s) {
  const bool outlives = !s.freed || s.later_step;
  if ((s.own & kOptimizer) != 0) return outlives ? Category::kStates : Category::kTemporaries;
  if ((s.own & kBackward) != 0) {
    const bool kept = outlives || (s.free_flags & (kOptimizer | kZeroGrad)) != 0 || (s.free_flags & kBackward) == 0;
    return kept ? Category::kGradients : Category::kTemporaries;
  }
  const bool freed_in_backward = s.freed && (s.free_flags & kBackward) != 0;
  if ((s.own & kModule) != 0) {
    if (!s.freed && s.before_backward) return Category::kParameters;
    if (freed_in_backward) return Category::kActivations;
    return s.freed ? Category::kTemporaries : Category::kUnknown;
  }
  // (a model's weights may be freed when the run ends, after its last backward)
  const bool held_through = s.before_backward && (!s.freed || s.ends_after_last_backward);
  if (held_through && (s.own & kLibraryNn) != 0) return Category::kParameters;
  const bool lives_into_backward = freed_in_backward || (s.freed && s.ends_after_backward) || !s.freed;
  return lives_into_backward ? Category::kInputs : Category::kTemporaries;
}

void check_inputs(const CategoryInputs& in) {
  const std::size_t n = in.index.size();
  STOWAGE_CHECK(in.flags.size() == n && in.is_alloc.size() == n && in.end.size() == n, "flags (", in.flags.size(),
                "), index (", n, "), is_alloc (", in.is_alloc.size(), ") and end (", in.end.size(),
                ") must have one entry a position");
  check_positions(in.index, static_cast<std::int64_t>(in.stack.size()) - 1, "index", true);
  check_positions(in.end, static_cast<std::int64_t>(n), "end", false);
  check_positions(in.step_starts, static_cast<std::int64_t>(n), "step_starts", false);
}

bool has(const std::string& text, std::string_view part) { return text.find(part) != std::string::npos; }

// Whether `name`, lowered (ASCII: no other character lowers to a letter of the words), names a loss.
bool names_loss(const std::string& name) {
  std::string lowered = name;
  std::transform(lowered.begin(), lowered.end(), lowered.begin(),
                 [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; });
  return has(lowered, "loss") || has(lowered, "cross_entropy") || has(lowered, "nll");
}

}  // namespace

std::int8_t stack_flags(std::span<const FrameNames> frames) {
  int flags = 0;
  bool in_module_call = false;  // frames run innermost first: a loss's frame counts below any module call
  for (const FrameNames& frame : frames) {
    const std::string& file = frame.filename;
    const std::string& name = frame.name;
    const bool module_call = name == "_call_impl" || name == "_wrapped_call_impl";
    in_module_call = in_module_call || module_call;
    if (!in_module_call && names_loss(name)) flags |= kLoss;
    if (!file.ends_with(".py")) continue;
    flags |= kPython;
    if (has(file, "/torch/optim/")) flags |= name == "zero_grad" ? kZeroGrad : kOptimizer;
    if ((name == "backward" || name == "grad") && (has(file, "/torch/_tensor.py") || has(file, "/torch/autograd/"))) {
      flags |= kBackward;
    }
    if (module_call && has(file, "/torch/nn/modules/module.py")) flags |= kModule;
    if (has(file, "/torch/nn/") || has(file, "/transformers/modeling_utils.py") || name == "__init__") {
      flags |= kLibraryNn;  // torch.nn, or a constructor (a module's __init__ making its weights)
    }
  }
  return static_cast<std::int8_t>(flags);
}

bool mark_autograd_thread(std::span<std::int8_t> flags, std::span<const std::int32_t> stack,
                          std::span<const std::int64_t> index, std::span<const std::uint8_t> is_alloc) {
  const std::size_t n = index.size();
  STOWAGE_CHECK(flags.size() == n && is_alloc.size() == n, "flags (", flags.size(), "), index (", n,
                ") and is_alloc (", is_alloc.size(), ") must have one entry a position");
  check_positions(index, static_cast<std::int64_t>(stack.size()) - 1, "index", true);
  std::size_t allocs = 0, with_python = 0;
  for (std::size_t p = 0; p < n; ++p) {
    allocs += is_alloc[p] != 0 ? 1U : 0U;
    with_python += is_alloc[p] != 0 && (flags[p] & kPython) != 0 ? 1U : 0U;
  }
  if (n == 0 || static_cast<double>(with_python) < 0.1 * static_cast<double>(std::max<std::size_t>(allocs, 1))) {
    return false;
  }
  for (std::size_t p = 0; p < n; ++p) {
    const std::int32_t s = stack[at(index[p])];
    if ((s >= 0 || (s == -1 && is_alloc[p] != 0)) && (flags[p] & kPython) == 0) {
      flags[p] = static_cast<std::int8_t>(flags[p] | kPython | kBackward);
    }
  }
  return true;
}

std::vector<std::int8_t> infer_categories(const CategoryInputs& in, std::span<const std::int64_t> positions) {
  check_inputs(in);
  const std::size_t n = in.index.size();
  check_positions(positions, static_cast<std::int64_t>(n) - 1, "positions", false);
  std::vector<std::int64_t> backwards;
  for (std::size_t p = 0; p < n; ++p) {
    if (in.is_alloc[p] != 0 && (in.flags[p] & kBackward) != 0) backwards.push_back(static_cast<std::int64_t>(p));
  }
  const auto none = static_cast<std::int64_t>(n);
  const std::int64_t first_backward = backwards.empty() ? none : backwards.front();
  const std::int64_t last_backward = backwards.empty() ? none : backwards.back();
  const Spans spans = backward_spans(backwards, in.step_starts);
  const auto stack_of = [&](std::int64_t p) { return in.stack[at(in.index[at(p)])]; };
  std::vector<std::int8_t> found(positions.size());
  NumpySearch step_of_end(in.step_starts, true), step_of_position(in.step_starts, true);
  for (std::size_t k = 0; k < positions.size(); ++k) {
    const std::int64_t q = positions[k];
    const std::int64_t e = in.end[at(q)];
    Seen seen;
    seen.own = in.flags[at(q)];
    seen.freed = e < none;
    if (seen.freed) {
      // A free whose frames tell nothing of its own (none, or its allocation's: stowage records
      // the block's) is placed by where it falls: in backward between a step's first and last
      // backward allocation, after it otherwise.
      const bool blind = stack_of(e) < 0 || stack_of(e) == stack_of(q);
      seen.free_flags = !blind ? in.flags[at(e)]
                               : static_cast<std::int8_t>(inside(spans, e) ? kPython | kBackward : kPython | kZeroGrad);
      seen.later_step = step_of_end.next(e) > step_of_position.next(q);
    }
    seen.before_backward = q < first_backward;
    seen.ends_after_backward = e > first_backward;
    seen.ends_after_last_backward = e > last_backward;
    found[k] = static_cast<std::int8_t>(rules(seen));
  }
  return found;
}

std::vector<std::int64_t> kept_without_backward(const CategoryInputs& in, std::span<const std::uint8_t> saved) {
  check_inputs(in);
  const std::size_t n = in.index.size();
  STOWAGE_CHECK(saved.empty() || saved.size() == n, "saved (", saved.size(), ") must have one entry a position (", n, ")");
  std::vector<std::int64_t> backwards, loop, candidates;
  for (std::size_t p = 0; p < n; ++p) {
    if (in.is_alloc[p] == 0) continue;
    const std::int8_t flags = in.flags[p];
    const auto position = static_cast<std::int64_t>(p);
    if ((flags & kBackward) != 0) backwards.push_back(position);
    if ((flags & kPython) != 0 && (flags & (kModule | kBackward | kOptimizer)) == 0) loop.push_back(position);
    if ((flags & kModule) != 0 && (flags & (kBackward | kOptimizer)) == 0 && (saved.empty() || saved[p] != 0)) {
      candidates.push_back(position);
    }
  }
  std::vector<std::int64_t> kept;
  for (const std::int64_t c : candidates) {
    const std::int64_t e = in.end[at(c)];
    const bool no_backward = upper_index(backwards, c) == lower_index(backwards, e);
    const bool outlived = upper_index(loop, c) < lower_index(loop, e);
    if (no_backward && outlived) kept.push_back(c);
  }
  std::vector<std::int32_t> stacks;
  for (const std::int64_t k : kept) stacks.push_back(in.stack[at(in.index[at(k)])]);
  std::sort(stacks.begin(), stacks.end());
  if (saved.empty() && std::unique(stacks.begin(), stacks.end()) - stacks.begin() < 3) return {};
  return kept;
}

std::vector<std::uint8_t> freed_in_backward(std::span<const std::int64_t> backward_allocs,
                                            std::span<const std::int64_t> end,
                                            std::span<const std::int64_t> step_starts,
                                            std::span<const std::int64_t> positions) {
  const auto n = static_cast<std::int64_t>(end.size());
  check_positions(backward_allocs, n, "backward_allocs", true);
  check_positions(step_starts, n, "step_starts", false);
  check_positions(positions, n - 1, "positions", false);
  const Spans spans = backward_spans(backward_allocs, step_starts);
  std::vector<std::uint8_t> found(positions.size());
  for (std::size_t k = 0; k < positions.size(); ++k) {
    const std::int64_t e = end[at(positions[k])];
    found[k] = e < n && inside(spans, e) ? 1 : 0;
  }
  return found;
}

}  // namespace stowage::snapshot
