#include "snapshot/recompute_estimate.hpp"

#include <algorithm>
#include <cstddef>
#include <map>
#include <set>
#include <string_view>
#include <vector>

#include "base/errors.hpp"
#include "snapshot/peak_estimates.hpp"

namespace stowage::snapshot {

namespace {

// Whether a module's name ends in a number (r"\d+$": "$" also before a final newline).
bool numbered(std::string_view name) {
  if (name.ends_with('\n')) name.remove_suffix(1);
  return !name.empty() && name.back() >= '0' && name.back() <= '9';
}

std::size_t at(std::int64_t position) { return static_cast<std::size_t>(position); }

struct Run {
  std::vector<std::int64_t> members;  // the run's allocations, in order
};

// One run's change to the series (added into `delta`, n + 1 entries).
void checkpoint_run(const Run& run, std::span<const std::int64_t> end, std::span<const std::int64_t> size,
                    std::span<const std::int64_t> own, const std::vector<bool>& is_activation, std::vector<Wide>& delta) {
  const std::int64_t first = run.members.front();
  const std::int64_t last = run.members.back();
  const auto n = static_cast<std::int64_t>(end.size());
  std::int64_t output = -1;  // the last member still live when the run ends: what the block returns
  for (const std::int64_t m : run.members) {
    if (end[at(m)] > last) output = m;
  }
  std::vector<std::int64_t> moved;
  Wide moved_bytes = 0;
  std::int64_t back = n;
  for (const std::int64_t m : run.members) {
    const std::int64_t e = end[at(m)];
    if (is_activation[at(m)] && m != output && e > last && e < n) {
      moved.push_back(m);
      moved_bytes += size[at(m)];
      back = std::min(back, e);
    }
  }
  if (moved.empty()) return;
  --back;  // its backward begins just before the first of them is freed: its forward runs again there
  Wide running = 0;
  Wide highest = 0;
  for (std::int64_t p = first; p <= last; ++p) {
    running += own[at(p)];
    if (p == first || running > highest) highest = running;
  }
  const Wide transient = std::max(Wide{0}, highest - moved_bytes);
  for (const std::int64_t m : moved) delta[at(m)] -= size[at(m)];  // not kept through forward ...
  delta[at(back)] += moved_bytes + transient;                        // ... back when its backward begins
  delta[at(back) + 1] -= transient;
}

}  // namespace

Wide checkpointed_peak(const LiveSeries& live, std::span<const std::uint8_t> is_alloc,
                       std::span<const std::int64_t> end, std::span<const std::int64_t> size,
                       std::span<const std::int64_t> own, std::span<const std::int64_t> activations,
                       std::span<const std::int64_t> block) {
  const std::size_t n = live.size();
  STOWAGE_CHECK(is_alloc.size() == n && end.size() == n && size.size() == n && own.size() == n && block.size() == n,
                "the live series (", n, " positions), is_alloc, end, size, own and block must have one entry a position");
  check_positions(end, static_cast<std::int64_t>(n), "end", false);
  check_positions(activations, static_cast<std::int64_t>(n) - 1, "activations", false);
  std::vector<bool> is_activation(n, false);
  for (const std::int64_t p : activations) is_activation[at(p)] = true;
  std::vector<Wide> delta(n + 1, 0);
  // Runs: consecutive allocations of one block (an allocation of another block, or of none,
  // ends a run).
  Run run;
  std::int64_t run_block = -1;
  for (std::size_t p = 0; p < n; ++p) {
    if (is_alloc[p] == 0) continue;
    if (!run.members.empty() && block[p] != run_block) {
      checkpoint_run(run, end, size, own, is_activation, delta);
      run.members.clear();
    }
    run_block = block[p];
    if (block[p] >= 0) run.members.push_back(static_cast<std::int64_t>(p));
  }
  if (!run.members.empty()) checkpoint_run(run, end, size, own, is_activation, delta);
  return changed_peak_wide(live, delta);
}

PathBlocks block_of_paths(std::span<const std::string> paths) {
  std::set<std::string_view> containers;  // modules with modules inside
  for (const std::string& path : paths) {
    if (const std::size_t dot = path.rfind('.'); dot != std::string::npos) containers.insert(std::string_view(path).substr(0, dot));
  }
  PathBlocks found;
  std::map<std::string, std::int64_t> index;
  for (const std::string& path : paths) {
    std::int64_t block = -1;
    // each proper prefix ending at a dot's end (depth >= 1: the root is never a block)
    for (std::size_t start = path.find('.'); start != std::string::npos && block < 0;) {
      const std::size_t end = path.find('.', start + 1);
      const std::string_view prefix = std::string_view(path).substr(0, end);
      const std::string_view name = std::string_view(path).substr(start + 1, end == std::string::npos ? end : end - start - 1);
      if (numbered(name) && containers.contains(prefix)) {
        const auto [at, added] = index.emplace(std::string(prefix), static_cast<std::int64_t>(found.blocks.size()));
        if (added) found.blocks.emplace_back(prefix);
        block = at->second;
      }
      start = end;
    }
    found.block_of_path.push_back(block);
  }
  return found;
}

}  // namespace stowage::snapshot
