// An op's time as a step's sizes change: a fixed cost plus a cost per byte its tensor arguments
// and results hold (`io_bytes`), one line per kind of op (its name, e.g. "aten::mm") fitted by
// least squares over every run of that kind at every point of a grid of recordings, neither term
// negative. One line per kind, not per op: small ops' times at small sizes are mostly noise, which
// a line through a few points of one op would carry far beyond the grid.
//
// Contract: a value type; fit_op_times reads the traces it is given and keeps nothing of them.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "planner/lifetime_trace.hpp"

namespace stowage::planner {

struct TimeLine {
  double fixed_ms = 0;
  double ms_per_byte = 0;

  double at(double io_bytes) const { return fixed_ms + ms_per_byte * io_bytes; }
};

// The least-squares line through (io_bytes, duration_ms) points: where its slope is not positive,
// the mean time alone; where its intercept is negative, the line through the origin instead.
// Throws LogicError for no points.
TimeLine fit_line(const std::vector<double>& io_bytes, const std::vector<double>& duration_ms);

// Per op name, the line through every run of that name in `traces`.
std::map<std::string, TimeLine> fit_op_times(const std::vector<const LifetimeTrace*>& traces);

}  // namespace stowage::planner
