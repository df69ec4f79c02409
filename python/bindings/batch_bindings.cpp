// stowage._core's part for stowage.fit's example batch: its layout (planner/batch_layout.hpp), how it cuts
// (planner/micro_cut.hpp), what its loss is a mean over (planner/loss_units.hpp), and what fit says of its
// weighing and of a step it cannot record or that outgrows its plan (planner/fit_weighing_table.hpp,
// fit_refusals.hpp). Cuts cross as a typed value; judgements as (what holds, why not); a batch fit cannot
// read or cut as ValueError; the table and the refusals as text.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "planner/batch_layout.hpp"
#include "planner/fit_refusals.hpp"
#include "planner/fit_weighing_table.hpp"
#include "planner/loss_units.hpp"
#include "planner/micro_cut.hpp"
#include "python/bindings/bindings.hpp"

namespace py = pybind11;

namespace stowage::python {

using Spans = std::vector<std::tuple<std::size_t, std::size_t, double>>;
template <typename Counts> using Named = std::vector<std::pair<std::string, Counts>>;  // (what it counts, its counts)

namespace {

void bind_fit_table(py::module_& module) {
  using planner::FitFacts;
  py::class_<FitFacts>(module, "FitFacts", "What fit knows beside its options (planner/fit_weighing_table.hpp).")
      .def(py::init([](std::string device, std::int64_t capacity, std::string capacity_bound, std::string recorded,
                       std::string optimizer, std::string states_kept_because, std::string tried,
                       std::optional<planner::HostLoad> load, planner::FitMemory memory, planner::FitHost host,
                       std::int64_t unplanned_peak, planner::FitBlocks blocks) {
             return FitFacts{std::move(device), capacity, std::move(capacity_bound), std::move(recorded),
                             std::move(optimizer), std::move(states_kept_because), std::move(tried), load,
                             std::move(memory), std::move(host), unplanned_peak, blocks};
           }),
           py::kw_only(), py::arg("device"), py::arg("capacity"), py::arg("capacity_bound"), py::arg("recorded"),
           py::arg("optimizer"), py::arg("states_kept_because"), py::arg("tried"), py::arg("load"), py::arg("memory"),
           py::arg("host"), py::arg("unplanned_peak"), py::arg("blocks") = planner::FitBlocks{});
  module.def(
      "fit_table",
      [](const std::vector<planner::FitOption>& options, std::size_t chosen, std::int64_t predicted_peak,
         std::vector<std::int64_t> saved_bytes, const FitFacts& facts, std::int64_t rows,
         std::optional<std::string> units, bool units_given, std::string checked, std::string not_cut) {
        return planner::fit_table(options, chosen, {predicted_peak, std::move(saved_bytes)}, facts,
                                  {rows, std::move(units), units_given, std::move(checked), std::move(not_cut)});
      },
      py::arg("options"), py::arg("chosen"), py::arg("predicted_peak"), py::arg("saved_bytes"), py::arg("facts"),
      py::kw_only(), py::arg("rows"), py::arg("units"), py::arg("units_given"), py::arg("checked"),
      py::arg("not_cut"), "The table fit prints: `options[chosen]` taken, its plan's peak and saved bytes.");
  module.def("no_fit_message", &planner::no_fit_message, py::arg("options"), py::arg("memory"), py::arg("unplanned"),
             py::arg("states_kept_because"), py::arg("tried"), py::arg("whole"), "Why no option fits.");
  module.def("busy_host_note", &planner::busy_host_note, py::arg("load"));
  module.def("too_large_message", &planner::too_large_message, py::arg("smallest"), py::arg("in_use"),
             py::arg("capacity"), py::arg("gradients"), py::arg("failure"));
  module.def("unrecordable_message", &planner::unrecordable_message, py::arg("full"), py::arg("tried"),
             py::arg("steps_differ"));
  module.def("fitted_out_of_memory", &planner::fitted_out_of_memory, py::arg("error"), py::arg("planned"),
             py::arg("cut"), py::arg("came"), py::arg("departed"));
  module.def("more_rows_refusal", &planner::more_rows_refusal, py::arg("rows"), py::arg("cut"));
}

}  // namespace

void bind_batches(py::module_& module) {
  using planner::MicroCut;
  module.attr("MIN_ROWS") = planner::kMinRows;
  py::class_<MicroCut>(module, "MicroCut", "How fit cuts batches into micro-batches (planner/micro_cut.hpp).")
      .def(py::init<std::int64_t, std::int64_t, std::int64_t>(), py::arg("rows"), py::arg("count"), py::arg("most"))
      .def_static("of", &MicroCut::of, py::arg("rows"), py::arg("count"))
      .def_static("finest", &MicroCut::finest, py::arg("rows"))
      .def_static("asked", &MicroCut::asked, py::arg("rows"), py::arg("count"), "None where fit chooses")
      .def_readonly("count", &MicroCut::count).def_readonly("most", &MicroCut::most)
      .def(
          "bounds", [](const MicroCut& cut, std::int64_t rows) { return py::tuple(py::cast(cut.bounds(rows))); },
          py::arg("rows"), "The micro-batches' first rows, and `rows` last: near-equal cuts.")
      .def("__eq__", [](const MicroCut& cut, const MicroCut& other) { return cut == other; }, py::is_operator());
  module.def(
      "batch_layout",
      [](const std::vector<std::tuple<std::string, std::vector<std::int64_t>, bool>>& tensors) {
        std::vector<planner::BatchTensor> read;
        for (const auto& [path, shape, integer] : tensors) read.push_back({path, shape, integer});
        auto layout = planner::batch_layout(read);
        return std::make_tuple(layout.rows, layout.seq, layout.per_row);
      },
      py::arg("tensors"), "(rows, seq or None, per_row paths) of [(path, shape, integer)]");
  module.def("recording_grids", &planner::recording_grids, py::arg("rows"), py::arg("seq"), "[(size, values)] each");
  module.def(
      "unit_shares",
      [](const std::string& name, const std::vector<double>& counts, const Named<std::vector<double>>& alike) {
        std::vector<planner::UnitCounts> others;
        for (const auto& [other, theirs] : alike) others.push_back({other, theirs});
        auto found = planner::unit_shares({name, counts}, others);
        return std::make_pair(found.shares, found.why_not);
      },
      py::arg("name"), py::arg("counts"), py::arg("alike"), "Each micro-batch's share of its units, and why not.");
  module.def(
      "judge_loss_units",
      [](const std::vector<std::pair<std::vector<double>, Spans>>& cuts,
         const Named<std::vector<std::vector<double>>>& candidates, const std::vector<std::string>& dtypes,
         const std::string& loss_dtype, bool tf32, std::optional<double> noise, const std::string& random_ops) {
        std::vector<planner::CutLosses> losses;
        for (const auto& [each, spans] : cuts) {
          auto& cut = losses.emplace_back(planner::CutLosses{each, {}});
          for (const auto& [first, end, loss] : spans) cut.spans.push_back({first, end, loss});
        }
        std::vector<planner::LossCandidate> counted;
        for (const auto& [name, counts] : candidates) counted.push_back({name, counts});
        const double tolerance = planner::loss_tolerance(dtypes, loss_dtype, tf32, noise);
        auto judged = planner::judge_loss_units(losses, counted, tolerance, random_ops);
        return std::make_tuple(judged.alike, judged.why_not, tolerance);
      },
      py::arg("cuts"), py::arg("candidates"), py::arg("dtypes"), py::arg("loss_dtype"), py::arg("tf32"),
      py::arg("noise"), py::arg("random_ops"), "(the candidates that hold; why none; the tolerance)");
  bind_fit_table(module);
}

}  // namespace stowage::python
