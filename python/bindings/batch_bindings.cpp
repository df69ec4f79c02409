// stowage._core's part for stowage.fit's example batch: how it cuts into micro-batches
// (planner/micro_cut.hpp) and what its loss is a mean over, judged on its losses
// (planner/loss_units.hpp). Cuts cross as a typed value; the judgement as (candidates, why not).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "planner/loss_units.hpp"
#include "planner/micro_cut.hpp"
#include "python/bindings/bindings.hpp"

namespace py = pybind11;

namespace stowage::python {

using Spans = std::vector<std::tuple<std::size_t, std::size_t, double>>;

void bind_batches(py::module_& module) {
  using planner::MicroCut;
  module.attr("MIN_ROWS") = planner::kMinRows;
  module.attr("SHARES_ALIKE") = planner::kSharesAlike;
  py::class_<MicroCut>(module, "MicroCut",
                       "How fit cuts batches: the example's rows as count micro-batches, none of any batch over "
                       "most rows (planner/micro_cut.hpp).")
      .def(py::init<std::int64_t, std::int64_t, std::int64_t>(), py::arg("rows"), py::arg("count"), py::arg("most"))
      .def_static("of", &MicroCut::of, py::arg("rows"), py::arg("count"))
      .def_static("finest", &MicroCut::finest, py::arg("rows"))
      .def_readonly("rows", &MicroCut::rows)
      .def_readonly("count", &MicroCut::count)
      .def_readonly("most", &MicroCut::most)
      .def("count_at", &MicroCut::count_at, py::arg("rows"), "How many micro-batches a batch of `rows` runs as.")
      .def(
          "bounds", [](const MicroCut& cut, std::int64_t rows) { return py::tuple(py::cast(cut.bounds(rows))); },
          py::arg("rows"), "The micro-batches' first rows, and `rows` last: near-equal cuts.")
      .def("__eq__", [](const MicroCut& cut, const MicroCut& other) { return cut == other; }, py::is_operator())
      .def("__repr__", [](const MicroCut& cut) {
        return "MicroCut(rows=" + std::to_string(cut.rows) + ", count=" + std::to_string(cut.count) +
               ", most=" + std::to_string(cut.most) + ")";
      });
  module.def(
      "judge_loss_units",
      [](const std::vector<std::pair<std::vector<double>, Spans>>& cuts,
         const std::vector<std::pair<std::string, std::vector<std::vector<double>>>>& candidates, double tolerance,
         const std::string& random_ops) {
        std::vector<planner::CutLosses> losses;
        for (const auto& [each, spans] : cuts) {
          auto& cut = losses.emplace_back(planner::CutLosses{each, {}});
          for (const auto& [first, end, loss] : spans) cut.spans.push_back({first, end, loss});
        }
        std::vector<planner::LossCandidate> counted;
        for (const auto& [name, counts] : candidates) counted.push_back({name, counts});
        auto judged = planner::judge_loss_units(losses, counted, tolerance, random_ops);
        return std::make_pair(judged.alike, judged.why_not);
      },
      py::arg("cuts"), py::arg("candidates"), py::arg("tolerance"), py::arg("random_ops"),
      "What the example batch's loss is a mean over (planner/loss_units.hpp): cuts as (micro-batch losses, "
      "[(first, end, span loss)]), candidates as (name, counts per cut per micro-batch); returns (the "
      "candidates' indices, the first naming the units; why none, where empty).");
}

}  // namespace stowage::python
