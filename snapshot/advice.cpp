#include "snapshot/advice.hpp"

#include <algorithm>
#include <cmath>

#include "base/byte_units.hpp"
#include "base/errors.hpp"
#include "snapshot/recompute_estimate.hpp"

namespace stowage::snapshot {

namespace {

std::size_t at(std::int64_t position) { return static_cast<std::size_t>(position); }

constexpr auto kStates = static_cast<std::int8_t>(Category::kStates);

// The rules over categories at the peak, in the order they are tried, with the call that removes each.
struct CategoryRule {
  Category category;
  const char* call;
};
constexpr CategoryRule kCategoryRules[] = {
    {Category::kStates,
     "keep them in host memory: stowage.offload.AdamW(params, ...) in place of torch's, or "
     "stowage.fit(model, factory, batch) to choose the share"},
    {Category::kActivations,
     "recompute or offload them: checkpoint each block (torch.utils.checkpoint, or "
     "model.gradient_checkpointing_enable() in transformers), `with stowage.offload.activations():` "
     "around forward and backward, or a plan choosing per tensor (stowage.fit, stowage.plan)"},
    {Category::kInputs,
     "train on smaller micro-batches of the same global batch: stowage.fit(..., micro_batches=\"auto\")"},
};

std::string bytes(Wide value) {
  STOWAGE_CHECK(value >= 0 && value < (Wide{1} << 64), "a byte count of the advice is outside 0..2**64");
  return format_bytes(static_cast<std::size_t>(value));
}

// `waste < kMinShare * total`, compared as Python compares an integer with a float: exactly.
bool below_share(Wide waste, Wide total) {
  const double bound = kMinShare * static_cast<double>(total);
  if (bound >= 0x1p126) return true;  // (beyond any sum of positions' sizes)
  return waste < static_cast<Wide>(std::ceil(bound));
}

Wide sum_of(std::span<const std::int64_t> size, std::span<const std::int64_t> positions) {
  Wide sum = 0;
  for (const std::int64_t p : positions) sum += size[at(p)];
  return sum;
}

struct Rules {
  AdviceEvidence& evidence;
  const AdvicePeak& peak;
  Wide total;
  std::vector<Advice> found;

  const AdviceTrace& trace() const { return evidence.trace(); }

  void categories();
  void kept_without_backward();
  void logits();
  void gradients();
  void growing(std::span<const GrowingSite> sites);
  void out_of_memory(const OomFacts& oom);
};

// States, activations and inputs at the peak: their saving re-simulated.
void Rules::categories() {
  const auto waste_of = [this](Category c) { return peak.by_category[static_cast<std::size_t>(c)]; };
  if (std::all_of(std::begin(kCategoryRules), std::end(kCategoryRules),
                  [&](const CategoryRule& rule) { return below_share(waste_of(rule.category), total); })) {
    return;
  }
  const std::vector<std::int8_t>& every = evidence.every();
  const AdviceTrace& t = trace();
  for (const CategoryRule& rule : kCategoryRules) {
    const Wide waste = waste_of(rule.category);
    if (below_share(waste, total)) continue;
    const auto category = static_cast<std::int8_t>(rule.category);
    std::vector<std::int64_t> removed;
    for (std::size_t p = 0; p < every.size(); ++p) {
      // (the update's temporaries go to the host with the states)
      if (every[p] == category || (category == kStates && evidence.made_by_optimizer(p) && t.is_alloc[p] != 0)) {
        removed.push_back(static_cast<std::int64_t>(p));
      }
    }
    const bool is_activations = rule.category == Category::kActivations;
    const bool blocks = is_activations && t.blocks > 0;
    const bool bound = is_activations && !blocks;  // (no module paths, or no blocks among them)
    Wide saving = 0;
    std::string how;
    if (blocks) {
      saving = total - checkpointed_peak(t.live, t.is_alloc, t.end, t.size, t.own, removed, t.block);
      how.append(" (each of the ").append(std::to_string(t.blocks)).append(" blocks checkpointed, e.g. ");
      how.append(peak.first_block).append(")");
    } else {
      saving = total - removed_peak(t.live, t.end, t.size, removed);
      if (bound) {
        how.append(" (at most ").append(bytes(saving)).append(": backward brings them back a block at a time)");
      }
    }
    const char* name = kCategoryNames[static_cast<std::size_t>(rule.category)];
    std::string text = bytes(waste);
    text.append(" of ").append(name).append(" live at the peak; ").append(rule.call).append(how);
    found.push_back({name, waste, saving, bound, std::move(text)});
  }
}

void Rules::kept_without_backward() {
  const std::vector<std::int64_t> kept = evidence.kept_without_backward();
  std::vector<std::int64_t> live_kept;
  std::set_intersection(kept.begin(), kept.end(), peak.live_at.begin(), peak.live_at.end(),
                        std::back_inserter(live_kept));
  live_kept.erase(std::unique(live_kept.begin(), live_kept.end()), live_kept.end());
  const Wide waste = sum_of(trace().size, live_kept);
  if (below_share(waste, total)) return;
  const Wide saving = total - removed_peak(trace().live, trace().end, trace().size, kept);
  std::string text = bytes(waste);
  text.append(
      " made in a forward that had no backward are live at the peak (autograd kept its graph): run evaluation and "
      "inference under torch.no_grad() or torch.inference_mode()");
  found.push_back({"forward without backward", waste, saving, std::nullopt, std::move(text)});
}

void Rules::logits() {
  const AdviceTrace& t = trace();
  std::vector<std::int64_t> logit_sizes;  // the loss's own large allocations' sizes, and their halves
  for (const std::int64_t p : evidence.loss_allocations()) {
    if (Wide{t.size[at(p)]} >= total / 100) logit_sizes.push_back(t.size[at(p)]);
  }
  if (logit_sizes.empty()) return;
  for (std::size_t k = 0, large = logit_sizes.size(); k < large; ++k) logit_sizes.push_back(logit_sizes[k] / 2);
  std::sort(logit_sizes.begin(), logit_sizes.end());
  const std::vector<std::int8_t>& every = evidence.every();
  const auto logit_like = [&](std::int64_t p) {
    const std::int8_t c = every[at(p)];
    const bool other = c != static_cast<std::int8_t>(Category::kParameters) &&
                       c != static_cast<std::int8_t>(Category::kGradients) && c != kStates;
    return t.is_alloc[at(p)] != 0 && other && std::binary_search(logit_sizes.begin(), logit_sizes.end(), t.size[at(p)]);
  };
  Wide waste = 0;
  for (const std::int64_t p : peak.live_at) {
    if (logit_like(p)) waste += t.size[at(p)];
  }
  if (below_share(waste, total)) return;
  const std::size_t n = evidence.positions();
  std::vector<Wide> change(n + 1, 0);
  for (std::size_t p = 0; p < n; ++p) {
    if (!logit_like(static_cast<std::int64_t>(p))) continue;
    const std::int64_t cut = t.size[p] - t.size[p] / kLossChunks;
    change[p] -= cut;
    change[at(t.end[p])] += cut;  // (at n when never freed: after the series)
  }
  const Wide saving = total - changed_peak_wide(t.live, change);
  std::string text = bytes(waste);
  text.append(
          " of logit-sized tensors (the output layer's, and the loss's copies and their gradients) are live at the "
          "peak: compute the loss in ")
      .append(std::to_string(kLossChunks))
      .append(
          " chunks of the tokens, each chunk's logits made and used in turn and recomputed in backward (a chunked "
          "cross-entropy, as stowage.models.llama.Llama.chunked_loss does, or Liger's and torchtune's)");
  found.push_back({"logits at the peak", waste, saving, std::nullopt, std::move(text)});
}

void Rules::gradients() {
  const AdviceTrace& t = trace();
  std::vector<std::int64_t> gradients;
  for (std::size_t k = 0; k < peak.live_at.size(); ++k) {
    if (peak.category_at[k] == static_cast<std::int8_t>(Category::kGradients)) gradients.push_back(peak.live_at[k]);
  }
  if (t.step_starts.empty() || gradients.empty()) return;
  const std::size_t step_of_peak = NumpySearch(t.step_starts, true).next(peak.position);
  NumpySearch step_of(t.step_starts, true);
  std::vector<std::int64_t> kept;  // made in an earlier step than the peak's
  for (const std::int64_t g : gradients) {
    if (step_of.next(g) < step_of_peak) kept.push_back(g);
  }
  const Wide waste = sum_of(t.size, kept);
  if (below_share(waste, total)) return;
  const std::vector<std::int64_t>& backward = evidence.backward_allocations();
  const bool bound = backward.empty();  // (backward not found: the gradients taken out, a bound)
  const Wide saving = total - (bound ? removed_peak(t.live, t.end, t.size, kept)
                                     : grads_set_to_none_peak(t.live, t.is_alloc, t.end, t.size, kept, backward,
                                                              t.step_starts));
  std::string text = bytes(waste);
  text.append(
      " of gradients made in an earlier step are live at the peak: optimizer.zero_grad(set_to_none=True) after each "
      "step");
  found.push_back({"gradients kept across steps", waste, saving, bound, std::move(text)});
}

// Named by the site that grows most; the saving counts every growing site.
void Rules::growing(std::span<const GrowingSite> sites) {
  if (sites.empty()) return;
  std::vector<std::int64_t> kept;
  for (const GrowingSite& site : sites) {
    const std::vector<std::int64_t> its = evidence.kept_across_steps(site.site);
    kept.insert(kept.end(), its.begin(), its.end());
  }
  std::sort(kept.begin(), kept.end());
  kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
  const AdviceTrace& t = trace();
  const Wide saving = kept.empty() ? Wide{0}
                                   : total - freed_when_made_peak(t.live, t.end, t.size, kept,
                                                                  evidence.backward_allocations(), t.step_starts);
  const GrowingSite& row = sites.front();
  std::string text = row.name;
  if (sites.size() > 1) text.append(" (and ").append(std::to_string(sites.size() - 1)).append(" more sites)");
  text.append(" keeps ").append(bytes(row.bytes_per_step));
  text.append(
      " more after every step: keep numbers, not tensors (loss.item()), or detach what is kept (tensor.detach())");
  found.push_back({"memory growing every step", row.bytes_per_step * row.steps, saving, std::nullopt, std::move(text)});
}

void Rules::out_of_memory(const OomFacts& oom) {
  const Wide short_by = oom.requested - oom.device_free;
  if (oom.under_stowage || short_by <= 0 || oom.cached_free < short_by) return;
  std::string text = "the request was ";
  text.append(bytes(short_by)).append(" short of the device's free bytes while the cache held ");
  text.append(bytes(oom.cached_free));
  text.append(" free in pieces: stowage's allocator (STOWAGE_ALLOC_CONF= or stowage.enable())");
  if (oom.replayed_reserved && *oom.replayed_reserved != 0) {
    text.append(", whose replay of this trace peaks at ").append(bytes(*oom.replayed_reserved)).append(" reserved");
  }
  found.push_back({"out of memory with the bytes free in pieces", oom.cached_free, short_by, std::nullopt,
                   std::move(text)});
}

}  // namespace

std::vector<Advice> advise(AdviceEvidence& evidence, const AdvicePeak& peak, std::span<const GrowingSite> growing,
                           const std::optional<OomFacts>& oom) {
  STOWAGE_CHECK(peak.live_at.size() == peak.category_at.size(), "the positions live at the peak (",
                peak.live_at.size(), ") and their categories (", peak.category_at.size(), ") differ in length");
  const auto n = static_cast<std::int64_t>(evidence.positions());
  STOWAGE_CHECK(peak.position >= -1 && peak.position < n, "the peak's position ", peak.position,
                " is outside -1..", n - 1);
  check_positions(peak.live_at, n - 1, "live_at", true);
  Rules rules{evidence, peak, std::max(peak.live_bytes, Wide{1}), {}};
  if (peak.position >= 0) {
    rules.categories();
    rules.kept_without_backward();
    rules.logits();
  }
  rules.gradients();
  rules.growing(growing);
  if (oom) rules.out_of_memory(*oom);
  std::vector<Advice> found;
  for (Advice& row : rules.found) {
    if (row.saving > 0) found.push_back(std::move(row));
  }
  std::stable_sort(found.begin(), found.end(), [](const Advice& a, const Advice& b) { return a.saving > b.saving; });
  return found;
}

}  // namespace stowage::snapshot
