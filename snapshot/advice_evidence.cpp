#include "snapshot/advice_evidence.hpp"

#include <algorithm>

#include "base/errors.hpp"

namespace stowage::snapshot {

namespace {

std::size_t at(std::int64_t position) { return static_cast<std::size_t>(position); }

}  // namespace

std::vector<std::int8_t> all_categories(const CategoryInputs& inputs) {
  const std::size_t n = inputs.is_alloc.size();
  std::vector<std::int8_t> out(n, static_cast<std::int8_t>(Category::kUnknown));
  std::vector<std::int64_t> allocs;
  for (std::size_t p = 0; p < n; ++p) {
    if (inputs.is_alloc[p] != 0) allocs.push_back(static_cast<std::int64_t>(p));
  }
  for (std::size_t start = 0; start < allocs.size(); start += kCategoryChunk) {
    const std::span<const std::int64_t> chunk =
        std::span<const std::int64_t>(allocs).subspan(start, std::min(kCategoryChunk, allocs.size() - start));
    const std::vector<std::int8_t> found = infer_categories(inputs, chunk);
    for (std::size_t k = 0; k < chunk.size(); ++k) out[at(chunk[k])] = found[k];
  }
  return out;
}

AdviceEvidence::AdviceEvidence(const AdviceTrace& trace) : trace_(trace) {
  const std::size_t n = trace.is_alloc.size();
  STOWAGE_CHECK(trace.live.size() == n && trace.end.size() == n && trace.size.size() == n && trace.own.size() == n &&
                    trace.index.size() == n && trace.flags.size() == n && trace.site.size() == n,
                "the live series, is_alloc, end, size, own, index, flags and site must have one entry a position (",
                n, ")");
  STOWAGE_CHECK(!trace.frames || trace.marked.size() == n, "marked flags (", trace.marked.size(),
                ") must have one entry a position (", n, ")");
  STOWAGE_CHECK(trace.exact_category.empty() || trace.exact_category.size() == n, "exact categories (",
                trace.exact_category.size(), ") must have one entry a position (", n, ")");
  STOWAGE_CHECK(trace.block.empty() || trace.block.size() == n, "blocks (", trace.block.size(),
                ") must have one entry a position (", n, ")");
  check_positions(trace.end, static_cast<std::int64_t>(n), "end", false);
  check_positions(trace.step_starts, static_cast<std::int64_t>(n), "step_starts", false);
}

CategoryInputs AdviceEvidence::inputs(bool with_steps) const {
  return {trace_.marked, trace_.stack, trace_.index, trace_.is_alloc, trace_.end,
          with_steps ? trace_.step_starts : Positions{}};
}

const std::vector<std::int8_t>& AdviceEvidence::every() {
  if (!every_) {
    if (!trace_.exact_category.empty()) {
      every_.emplace(trace_.exact_category.begin(), trace_.exact_category.end());
    } else if (trace_.frames) {
      every_ = all_categories(inputs(true));
    } else {
      every_.emplace(positions(), static_cast<std::int8_t>(Category::kUnknown));  // no Python frames to read
    }
  }
  return *every_;
}

const std::vector<std::int64_t>& AdviceEvidence::backward_allocations() {
  if (!backward_) {
    backward_.emplace();
    for (std::size_t p = 0; trace_.frames && p < positions(); ++p) {
      if (trace_.is_alloc[p] != 0 && (trace_.marked[p] & kBackward) != 0) {
        backward_->push_back(static_cast<std::int64_t>(p));
      }
    }
  }
  return *backward_;
}

std::vector<std::int64_t> AdviceEvidence::kept_without_backward() const {
  if (!trace_.frames) return {};
  std::vector<std::uint8_t> saved;
  for (const std::int8_t category : trace_.exact_category) {
    saved.push_back(category == static_cast<std::int8_t>(Category::kActivations) ? 1 : 0);
  }
  return snapshot::kept_without_backward(inputs(false), saved);
}

std::vector<std::int64_t> AdviceEvidence::kept_across_steps(std::int64_t site) {
  if (site < 0) return {};
  std::vector<std::int64_t> made;
  for (std::size_t p = 0; p < positions(); ++p) {
    if (trace_.site[p] == site) made.push_back(static_cast<std::int64_t>(p));
  }
  NumpySearch step_of_end(trace_.step_starts, true), step_of_made(trace_.step_starts, true);
  std::vector<std::int64_t> later;
  for (const std::int64_t p : made) {  // (each search in turn over all its keys, as numpy's)
    if (step_of_end.next(trace_.end[at(p)]) > step_of_made.next(p)) later.push_back(p);
  }
  const std::vector<std::uint8_t> in_backward =
      freed_in_backward(backward_allocations(), trace_.end, trace_.step_starts, later);
  std::vector<std::int64_t> kept;
  for (std::size_t k = 0; k < later.size(); ++k) {
    if (in_backward[k] == 0) kept.push_back(later[k]);
  }
  return kept;
}

std::vector<std::int64_t> AdviceEvidence::loss_allocations() const {
  std::vector<std::int64_t> found;
  for (std::size_t p = 0; trace_.frames && p < positions(); ++p) {
    const std::int8_t flags = trace_.marked[p];
    if (trace_.is_alloc[p] != 0 && (flags & kLoss) != 0 && (flags & (kBackward | kOptimizer)) == 0) {
      found.push_back(static_cast<std::int64_t>(p));
    }
  }
  return found;
}

}  // namespace stowage::snapshot
