#include "planner/time_fit.hpp"

#include <cstddef>
#include <utility>

#include "base/errors.hpp"

namespace stowage::planner {

TimeLine fit_line(const std::vector<double>& io_bytes, const std::vector<double>& duration_ms) {
  STOWAGE_CHECK(!io_bytes.empty() && io_bytes.size() == duration_ms.size(),
                "a time line needs one or more points, each with bytes and a time");
  const auto n = static_cast<double>(io_bytes.size());
  double sum_x = 0;
  double sum_t = 0;
  for (std::size_t i = 0; i < io_bytes.size(); ++i) {
    sum_x += io_bytes[i];
    sum_t += duration_ms[i];
  }
  const double mean_x = sum_x / n;
  const double mean_t = sum_t / n;
  double spread = 0;
  double covariance = 0;
  for (std::size_t i = 0; i < io_bytes.size(); ++i) {
    spread += (io_bytes[i] - mean_x) * (io_bytes[i] - mean_x);
    covariance += (io_bytes[i] - mean_x) * (duration_ms[i] - mean_t);
  }
  const double slope = spread != 0 ? covariance / spread : 0.0;
  if (slope <= 0) return {mean_t, 0.0};
  const double fixed = mean_t - slope * mean_x;
  if (fixed >= 0) return {fixed, slope};
  double xt = 0;  // through the origin: least squares of t = slope * x
  double xx = 0;
  for (std::size_t i = 0; i < io_bytes.size(); ++i) {
    xt += io_bytes[i] * duration_ms[i];
    xx += io_bytes[i] * io_bytes[i];
  }
  return {0.0, xt / xx};
}

std::map<std::string, TimeLine> fit_op_times(const std::vector<const LifetimeTrace*>& traces) {
  std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> points;
  for (const LifetimeTrace* trace : traces) {
    for (const TraceOp& op : trace->ops) {
      auto& [xs, ts] = points[op.name];
      xs.push_back(static_cast<double>(op.io_bytes));
      ts.push_back(op.duration_ms);
    }
  }
  std::map<std::string, TimeLine> lines;
  for (const auto& [name, xy] : points) lines.emplace(name, fit_line(xy.first, xy.second));
  return lines;
}

}  // namespace stowage::planner
