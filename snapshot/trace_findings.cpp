#include "snapshot/trace_findings.hpp"

#include <algorithm>
#include <numeric>

#include "base/errors.hpp"
#include "snapshot/advice_evidence.hpp"
#include "snapshot/categories.hpp"
#include "snapshot/live_groups.hpp"
#include "snapshot/live_pairs.hpp"
#include "snapshot/names.hpp"
#include "snapshot/trace_sites.hpp"

namespace stowage::snapshot {

namespace {

std::size_t at(std::int64_t position) { return static_cast<std::size_t>(position); }

// The allocations live just after `position` (none before the first).
std::vector<std::int64_t> live_positions(const LivePairs& pairs, std::int64_t position) {
  std::vector<std::int64_t> live;
  for (std::int64_t p = 0; p <= position; ++p) {
    if (pairs.is_alloc[at(p)] != 0 && pairs.end[at(p)] > position) live.push_back(p);
  }
  return live;
}

// The `top` module paths by bytes of the allocations `live`, most first (ties by path index).
std::vector<ModuleLive> module_totals(const std::vector<std::string>& paths, std::span<const std::int64_t> module,
                                      std::span<const std::int64_t> live, std::span<const std::int64_t> size,
                                      std::size_t top) {
  std::vector<Wide> summed(paths.size(), 0);
  for (const std::int64_t p : live) summed[at(module[at(p)])] += size[at(p)];
  std::vector<std::size_t> order(paths.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return summed[a] > summed[b]; });
  std::vector<ModuleLive> found;
  for (std::size_t k = 0; k < std::min(top, order.size()); ++k) {
    if (summed[order[k]] > 0) found.push_back({paths[order[k]], summed[order[k]]});
  }
  return found;
}

// Sites by live bytes just after a position, what was live before the trace still is, and the
// trace's own live bytes.
struct Ranked {
  std::vector<SiteLive> rows;
  Wide pre_trace = 0, own_live = 0;
};

class Analysis {
 public:
  Analysis(const TraceInput& trace, const TraceOptions& options);
  TraceFindings run();

 private:
  Ranked ranked_at(std::int64_t position) const;
  std::pair<Peak, std::int64_t> peak_over(bool in_trial) const;  // and its position
  std::vector<std::int8_t> categories_at(const std::vector<std::int64_t>& live,
                                         std::span<const std::int64_t> step_starts) const;
  void explain_ooms(TraceFindings& found) const;
  std::vector<GrowingSite> growing(const Steps& steps) const;
  void place_tags(const ExactTags& tags);
  Timelines timelines(const Peak& peak, std::span<const std::int64_t> step_starts) const;

  const TraceInput& trace_;
  const TraceOptions& options_;
  LivePairs pairs_;
  TraceSites sites_;
  std::vector<Wide> live_;             // live bytes just after each position
  std::vector<std::int64_t> narrow_;   // the same as int64, where the sizes cannot pass it
  LiveSeries series_;
  std::vector<Wide> unknown_through_;  // unknown frees' bytes up to and including each position
  Wide baseline_ = 0;
  std::vector<std::uint8_t> trial_;
  std::vector<std::int8_t> flags_, marked_;
  bool frames_ = false;
  std::vector<std::int8_t> exact_category_;
  std::vector<std::int64_t> exact_module_, block_;
};

Analysis::Analysis(const TraceInput& trace, const TraceOptions& options)
    : trace_(trace), options_(options), pairs_(pair_trace(trace.action, trace.addr, trace.size)),
      sites_(name_sites(trace.stack, trace.stacks, trace.size, pairs_)) {
  const std::size_t n = pairs_.index.size();
  Wide own = 0, unknown = 0;
  live_.assign(n, Wide{0});
  unknown_through_.assign(n, Wide{0});
  for (std::size_t p = 0; p < n; ++p) {
    own += pairs_.own[p];
    unknown += pairs_.unknown[p];
    live_[p] = own - unknown;
    unknown_through_[p] = unknown;
  }
  baseline_ = options.requested_at_end ? *options.requested_at_end - own + unknown : unknown;
  baseline_ = std::max({baseline_, unknown, Wide{0}});
  for (Wide& value : live_) value += baseline_;
  // Sizes that could sum past int64 are compared with floats exactly, as Python's integers.
  if (numpy_float_sum(pairs_.size) >= 0x1p62) {
    series_ = LiveSeries(std::span<const Wide>(live_));
  } else {
    narrow_.assign(live_.begin(), live_.end());
    series_ = LiveSeries(std::span<const std::int64_t>(narrow_));
  }
  trial_ = in_trial(trace.marks, pairs_.index);
  std::vector<std::int8_t> by_stack;
  for (const std::vector<Frame>& frames : trace.stacks) {
    std::vector<FrameNames> names;
    for (const Frame& frame : frames) names.push_back({frame.filename, frame.name});
    by_stack.push_back(stack_flags(names));
  }
  flags_.resize(n, 0);
  for (std::size_t p = 0; p < n; ++p) {
    const std::int32_t stack = trace.stack[at(pairs_.index[p])];
    if (stack >= 0) flags_[p] = by_stack[static_cast<std::size_t>(stack)];
  }
  marked_ = flags_;
  frames_ = mark_autograd_thread(marked_, trace.stack, pairs_.index, pairs_.is_alloc);
  if (options.tags) place_tags(*options.tags);
}

void Analysis::place_tags(const ExactTags& tags) {
  const std::size_t n = pairs_.index.size();
  STOWAGE_CHECK(tags.category.size() == tags.events.size() && tags.module.size() == tags.events.size(),
                "tags: events, category and module differ in length");
  STOWAGE_CHECK(tags.block_of_path.size() == tags.paths.size(), "tags: one block a module path");
  exact_category_.assign(n, static_cast<std::int8_t>(Category::kTemporaries));
  exact_module_.assign(n, 0);
  for (std::size_t k = 0; k < tags.events.size(); ++k) {
    const std::size_t p = lower_index(pairs_.index, tags.events[k]);
    STOWAGE_CHECK(p < n && pairs_.index[p] == tags.events[k] && pairs_.is_alloc[p] != 0, "tags: event ",
                  tags.events[k], " is not an allocation");
    STOWAGE_CHECK(tags.module[k] >= 0 && at(tags.module[k]) < tags.paths.size(), "tags: module ", tags.module[k],
                  " is not a path's");
    exact_category_[p] = tags.category[k];
    exact_module_[p] = tags.module[k];
  }
  block_.resize(n);
  for (std::size_t p = 0; p < n; ++p) block_[p] = tags.block_of_path.at(at(exact_module_[p]));
}

Ranked Analysis::ranked_at(std::int64_t position) const {
  Ranked found;
  found.pre_trace = baseline_ - (position >= 0 ? unknown_through_[at(position)] : Wide{0});
  if (position >= 0) {
    const LiveAt live = live_at(pairs_.is_alloc, pairs_.end, pairs_.size, sites_.of, sites_.names.size(), position);
    std::vector<std::size_t> present;
    for (std::size_t s = 0; s < sites_.names.size(); ++s) {
      if (live.count[s] != 0) present.push_back(s);
    }
    std::stable_sort(present.begin(), present.end(),
                     [&](std::size_t a, std::size_t b) { return sites_.first[a] < sites_.first[b]; });
    for (const std::size_t s : present) {
      found.own_live += live.bytes[s];
      if (live.bytes[s] > 0) found.rows.push_back({sites_.names[s], live.bytes[s], live.count[s]});
    }
  }
  if (found.pre_trace > 0) found.rows.push_back({kBeforeTrace, found.pre_trace, 0});
  std::stable_sort(found.rows.begin(), found.rows.end(),
                   [](const SiteLive& a, const SiteLive& b) { return a.bytes > b.bytes; });
  if (found.rows.size() > options_.top) found.rows.resize(options_.top);
  return found;
}

std::pair<Peak, std::int64_t> Analysis::peak_over(bool in_trial) const {
  Wide best = 0;
  std::int64_t best_at = -1;  // own - unknown at its highest, first reached; -1: before any event
  std::optional<std::size_t> highest;
  for (std::size_t p = 0; p < live_.size(); ++p) {
    if ((trial_[p] != 0) != in_trial) continue;
    if (!highest || live_[p] > live_[*highest]) highest = p;
  }
  if (highest && live_[*highest] - baseline_ > 0) {
    best = live_[*highest] - baseline_;
    best_at = static_cast<std::int64_t>(*highest);
  }
  Peak peak;
  peak.live_bytes = baseline_ + best;
  peak.event_index = best_at >= 0 ? pairs_.index[at(best_at)] : -1;
  peak.baseline = baseline_;
  peak.sites = ranked_at(best_at).rows;
  return {std::move(peak), best_at};
}

std::vector<std::int8_t> Analysis::categories_at(const std::vector<std::int64_t>& live,
                                                 std::span<const std::int64_t> step_starts) const {
  if (!exact_category_.empty()) {
    std::vector<std::int8_t> category;
    for (const std::int64_t p : live) category.push_back(exact_category_[at(p)]);
    return category;
  }
  if (!frames_) return std::vector<std::int8_t>(live.size(), static_cast<std::int8_t>(Category::kUnknown));
  const CategoryInputs inputs{marked_, trace_.stack, pairs_.index, pairs_.is_alloc, pairs_.end, step_starts};
  return infer_categories(inputs, live);
}

void Analysis::explain_ooms(TraceFindings& found) const {
  const std::uint8_t oom = *action_code(Name::kOom);
  std::vector<std::int64_t> events;
  for (std::size_t e = 0; e < trace_.action.size(); ++e) {
    if (trace_.action[e] == oom) events.push_back(static_cast<std::int64_t>(e));
  }
  found.oom_events = static_cast<std::int64_t>(events.size());
  if (events.size() > kMaxOoms) events.resize(kMaxOoms);
  const std::vector<std::uint8_t> in_fit_trial = in_trial(trace_.marks, events);
  for (std::size_t k = 0; k < events.size(); ++k) {
    const std::int64_t event = events[k];
    Ranked ranked = ranked_at(static_cast<std::int64_t>(lower_index(pairs_.index, event)) - 1);
    const auto free = trace_.device_free.find(event);
    found.ooms.push_back({event, Wide{trace_.size[at(event)]},
                          free != trace_.device_free.end() ? free->second : Wide{trace_.addr[at(event)]},
                          ranked.pre_trace + ranked.own_live, std::move(ranked.rows), in_fit_trial[k] != 0,
                          options_.under_stowage});
  }
}

std::vector<GrowingSite> Analysis::growing(const Steps& steps) const {
  std::vector<const Step*> run;  // the run's whole steps, the first left out: it makes the optimizer's states
  const std::size_t whole = steps.found_by == "repeating allocations" && !steps.steps.empty()
                                ? steps.steps.size() - 1
                                : steps.steps.size();
  for (std::size_t k = 0; k < whole; ++k) {
    if (!steps.steps[k].fit_trial) run.push_back(&steps.steps[k]);
  }
  if (!run.empty()) run.erase(run.begin());
  if (run.size() > kGrowthWindow) run.erase(run.begin(), run.end() - kGrowthWindow);
  if (run.size() < kMinGrowingSteps + 1) return {};
  std::vector<std::int64_t> ends;
  for (const Step* step : run) ends.push_back(static_cast<std::int64_t>(upper_index(pairs_.index, step->last_event)) - 1);
  std::vector<GrowingSite> found;
  for (const Growing& row : growing_groups(pairs_.is_alloc, pairs_.end, pairs_.size, sites_.of, sites_.first, ends)) {
    found.push_back({row.group, sites_.names[at(row.group)], row.bytes_per_step, row.steps});
    if (found.size() == options_.top) break;
  }
  return found;
}

Timelines Analysis::timelines(const Peak& peak, std::span<const std::int64_t> step_starts) const {
  std::vector<std::int8_t> category = exact_category_;
  if (category.empty() && frames_) {
    category = all_categories({marked_, trace_.stack, pairs_.index, pairs_.is_alloc, pairs_.end, step_starts});
  } else if (category.empty()) {
    category.assign(pairs_.index.size(), static_cast<std::int8_t>(Category::kUnknown));
  }
  TimelineInputs inputs{pairs_, sites_, baseline_, peak.sites, category, exact_module_, {}, {}, {}};
  if (options_.tags) {
    inputs.paths = options_.tags->paths;
    inputs.block_of_path = options_.tags->block_of_path;
    inputs.blocks = options_.tags->blocks;
  }
  return timelines_of(inputs);
}

TraceFindings Analysis::run() {
  TraceFindings found;
  std::int64_t at_peak = -1;
  std::tie(found.peak, at_peak) = peak_over(false);
  found.steps = cut_steps(trace_.marks, pairs_.index, series_, pairs_.is_alloc, pairs_.size);
  std::vector<std::int64_t> step_starts;
  for (const Step& step : found.steps.steps) {
    step_starts.push_back(static_cast<std::int64_t>(lower_index(pairs_.index, step.first_event)));
  }
  const std::vector<std::int64_t> live = live_positions(pairs_, at_peak);
  const std::vector<std::int8_t> category = categories_at(live, step_starts);
  found.exact_categories = !exact_category_.empty();
  AdvicePeak peak{std::max(found.peak.live_bytes, Wide{1}), at_peak, live, category, {}, ""};
  for (std::size_t k = 0; k < live.size(); ++k) peak.by_category[at(category[k])] += pairs_.size[at(live[k])];
  for (std::size_t c = 0; c < peak.by_category.size(); ++c) {
    if (peak.by_category[c] != 0) found.peak.categories.emplace_back(kCategoryNames[c], peak.by_category[c]);
  }
  if (options_.tags) {
    found.peak.modules = module_totals(options_.tags->paths, exact_module_, live, pairs_.size, options_.top);
    if (!options_.tags->blocks.empty()) peak.first_block = options_.tags->blocks.front();
  }
  if (std::any_of(trial_.begin(), trial_.end(), [](std::uint8_t inside) { return inside != 0; })) {
    found.fit_trial_peak = peak_over(true).first;
  }
  explain_ooms(found);
  found.growing = growing(found.steps);
  const AdviceTrace trace{series_, pairs_.is_alloc, pairs_.end, pairs_.size, pairs_.own, pairs_.index,
                          trace_.stack, flags_, marked_, frames_, step_starts, sites_.of, exact_category_, block_,
                          options_.tags ? options_.tags->blocks.size() : 0};
  std::optional<OomFacts> oom;
  for (const OomFinding& row : found.ooms) {
    if (row.in_fit_trial) continue;
    oom = OomFacts{row.requested, row.device_free, options_.cached_free, std::nullopt, row.under_stowage};
    break;
  }
  AdviceEvidence evidence(trace);
  found.advice = advise(evidence, peak, found.growing, oom);
  if (options_.timelines) found.timelines = timelines(found.peak, step_starts);
  for (const std::int64_t event : options_.moments) {
    LiveMoment& moment = found.moments.emplace_back();
    moment.event_index = event;
    const auto position = static_cast<std::int64_t>(upper_index(pairs_.index, event)) - 1;
    const std::vector<std::int64_t> live_then = live_positions(pairs_, position);
    for (const std::int64_t p : live_then) moment.events.push_back(pairs_.index[at(p)]);
    moment.categories = categories_at(live_then, step_starts);
  }
  return found;
}

}  // namespace

TraceFindings analyse_trace(const TraceInput& trace, const TraceOptions& options) {
  return Analysis(trace, options).run();
}

}  // namespace stowage::snapshot
