#include "planner/micro_cut.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "base/errors.hpp"

namespace stowage::planner {
namespace {

std::int64_t ceil_div(std::int64_t value, std::int64_t divisor) { return (value + divisor - 1) / divisor; }

}  // namespace

MicroCut MicroCut::of(std::int64_t rows, std::int64_t count) {
  STOWAGE_CHECK(rows >= 1 && count >= 1, "MicroCut: rows and count must be positive, not ", rows, " and ", count);
  return {rows, count, ceil_div(rows, count)};
}

MicroCut MicroCut::finest(std::int64_t rows) {
  return of(rows, std::max(std::min(rows / kMinRows, kCheckGroups), std::int64_t{1}));
}

std::optional<MicroCut> MicroCut::asked(std::int64_t rows, std::optional<std::int64_t> count) {
  if (rows < 1) {
    throw std::invalid_argument("stowage.fit: the example batch has no rows (its tensors' first dimension is 0); "
                                "give fit the largest batch the loop trains on");
  }
  if (!count) return rows >= 2 * kMinRows ? std::nullopt : std::optional<MicroCut>{of(rows, 1)};
  if (*count < 1) {
    throw std::invalid_argument("stowage.fit: micro_batches is 'auto' or a count of 1 or more, not " +
                                std::to_string(*count));
  }
  if (*count > 1 && rows / *count < kMinRows) {
    throw std::invalid_argument("stowage.fit: " + std::to_string(*count) + " micro-batches of a batch of " +
                                std::to_string(rows) + " rows leave fewer than " + std::to_string(kMinRows) +
                                " rows in one");
  }
  return of(rows, *count);
}

std::int64_t MicroCut::count_at(std::int64_t batch_rows) const {
  STOWAGE_CHECK(batch_rows >= 0 && most >= 1, "MicroCut: a batch of ", batch_rows, " rows cut at most ", most);
  const std::int64_t up_to = std::min(count, std::max(batch_rows / kMinRows, std::int64_t{1}));
  return std::max({ceil_div(batch_rows, most), up_to, std::int64_t{1}});
}

std::vector<std::int64_t> MicroCut::bounds(std::int64_t batch_rows) const {
  const std::int64_t pieces = count_at(batch_rows);
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(pieces) + 1);
  for (std::int64_t i = 0; i <= pieces; ++i) out.push_back(batch_rows * i / pieces);
  return out;
}

std::vector<RecordingGrid> recording_grids(std::int64_t rows, std::int64_t seq) {
  static constexpr std::int64_t kEighths[3][3] = {{4, 5, 6}, {2, 3, 4}, {1, 2, 3}};  // nearest the example first
  RecordingGrid by_rows;
  if (rows >= kMinRows + 1) by_rows.push_back({"batch", {kMinRows, kMinRows + 1}});
  std::vector<RecordingGrid> grids;
  if (seq < 24) {
    if (!by_rows.empty()) grids.push_back(by_rows);
    return grids;
  }
  for (const auto& eighths : kEighths) {
    std::vector<std::int64_t> points;
    for (const std::int64_t eighth : eighths) {
      const std::int64_t point = std::max(seq * eighth / 8, std::int64_t{1});
      if (std::find(points.begin(), points.end(), point) == points.end()) points.push_back(point);
    }
    if (points.size() < 3) continue;
    RecordingGrid grid = by_rows;
    grid.push_back({"seq", std::move(points)});
    grids.push_back(std::move(grid));
  }
  return grids;
}

}  // namespace stowage::planner
