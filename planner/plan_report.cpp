#include "planner/plan_report.hpp"

#include <algorithm>
#include <map>

namespace stowage::planner {
namespace {

bool is_index(std::string_view part) {
  return !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

std::string module_group(std::string_view path) {
  std::string folded;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = path.find('.', start);
    const std::string_view part = path.substr(start, dot == std::string_view::npos ? dot : dot - start);
    if (start > 0) folded.push_back('.');
    folded.append(start > 0 && is_index(part) ? std::string_view("*") : part);  // (the first part is no index)
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  const std::size_t last = folded.rfind('.');
  if (last != std::string::npos) return folded.substr(0, last);
  return folded.empty() ? "(top)" : folded;
}

std::vector<ModuleBytes> bytes_by_module(const LifetimeTrace& trace, const Plan& plan) {
  std::vector<ModuleBytes> rows;
  std::map<std::string, std::size_t, std::less<>> row_of;
  for (std::size_t t = 0; t < trace.tensors.size(); ++t) {
    std::string group = module_group(trace.tensors[t].module);
    const auto [found, added] = row_of.try_emplace(group, rows.size());
    if (added) rows.push_back({std::move(group)});
    ModuleBytes& row = rows[found->second];
    const std::uint64_t bytes = trace.tensors[t].bytes;
    (plan[t] == Decision::kKeep ? row.keep : plan[t] == Decision::kOffload ? row.offload : row.recompute) += bytes;
  }
  return rows;
}

std::vector<ReferencePlan> reference_plans(const LifetimeTrace& trace) {
  std::vector<ReferencePlan> plans{{"no change", {}, {}}, {"full checkpointing", {}, {}}, {"offload everything", {}, {}}};
  for (const SavedTensor& tensor : trace.tensors) {
    plans[0].decisions.push_back(Decision::kKeep);
    plans[1].decisions.push_back(tensor.recomputable ? Decision::kRecompute : Decision::kKeep);
    plans[2].decisions.push_back(tensor.offloadable ? Decision::kOffload : Decision::kKeep);
  }
  Simulator simulator(trace, trace.cost, Simulator::kNoCeiling);
  for (ReferencePlan& plan : plans) plan.simulation = simulator.simulate(plan.decisions);
  return plans;
}

}  // namespace stowage::planner
