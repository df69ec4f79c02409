// `stowage diff`'s report as the terminal shows it: the comparison (snapshot_diff.hpp) as tables of
// text cells and the line on segments between them. The printer only lays them out (its header, the
// two files' names, is its own).
//
// Contract: a pure function, no state. Byte counts as format_bytes writes them, changes signed ("+1.50
// GiB", "-512.00 MiB"; no sign for none), "-" for a figure one snapshot does not have (the live peak
// of an empty trace); fragmentation in percent, its change in points.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "snapshot/snapshot_diff.hpp"

namespace stowage::snapshot {

struct TextTable {
  std::string title;
  std::vector<std::string> columns;
  std::vector<std::string> left;  // the columns justified left; the others right
  std::vector<std::vector<std::string>> rows;
};

struct DiffReport {
  TextTable totals;
  std::vector<TextTable> sites;  // grew, then shrank, each only when a site did
  std::string segments;          // given back, new, changed in place: counts and bytes
  std::optional<TextTable> changed_segments;
};

DiffReport diff_report(const SnapshotsDiff& diff);

}  // namespace stowage::snapshot
