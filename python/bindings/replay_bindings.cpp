// stowage._core.ReplayEvents: one device's alloc, free and step-end events, replayed in C++ without the GIL;
// after_warmup, the figures of the steps after the warm-up; replay_table, the rows `stowage replay` prints.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "allocator/capacity_search.hpp"
#include "allocator/config.hpp"
#include "allocator/replay.hpp"
#include "allocator/replay_table.hpp"
#include "base/errors.hpp"
#include "python/bindings/bindings.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace stowage::python {

namespace {

using Bytes = py::array_t<std::uint64_t, py::array::c_style | py::array::forcecast>;
using Kinds = py::array_t<std::uint8_t, py::array::c_style | py::array::forcecast>;

Trace make_trace(const Kinds& kinds, const Bytes& addresses, const Bytes& sizes,
                 const Bytes& streams) {
  const auto n = static_cast<std::size_t>(kinds.size());
  STOWAGE_CHECK(static_cast<std::size_t>(addresses.size()) == n &&
                    static_cast<std::size_t>(sizes.size()) == n &&
                    static_cast<std::size_t>(streams.size()) == n,
                "kinds, addresses, sizes and streams must have the same length");
  const std::uint8_t* kind = kinds.data();
  const std::uint64_t* address = addresses.data();
  const std::uint64_t* size = sizes.data();
  const std::uint64_t* stream = streams.data();
  std::vector<TraceEvent> events(n);
  for (std::size_t i = 0; i < n; ++i) {
    STOWAGE_CHECK(kind[i] <= 2, "event ", i, " has kind ", int{kind[i]},
                  " (0: alloc, 1: free, 2: end of a step)");
    events[i] = {static_cast<TraceEvent::Kind>(kind[i]), address[i], size[i], stream[i]};
  }
  return Trace(std::move(events));
}

py::dict to_dict(const ReplayResult& result) {
  py::list steps;
  for (const ReplayStep& step : result.steps) {
    steps.append(py::dict("maps"_a = step.maps, "unmaps"_a = step.unmaps, "device_calls"_a = step.device_calls,
                          "charged_ns"_a = step.charged_ns, "reserved"_a = step.reserved));
  }
  const auto if_oom = [&result](auto value) { return result.oom ? py::cast(value) : py::object(py::none()); };
  return py::dict(
      "events"_a = result.events, "allocs"_a = result.allocs, "frees"_a = result.frees,
      "skipped_frees"_a = result.skipped_frees, "zero_size"_a = result.zero_size,
      "implicit_frees"_a = result.implicit_frees, "peak_requested"_a = result.peak_requested,
      "peak_allocated"_a = result.peak_allocated, "peak_reserved"_a = result.peak_reserved,
      "peak_mapped_pages"_a = result.peak_mapped_pages, "maps"_a = result.maps, "unmaps"_a = result.unmaps,
      "layouts_made"_a = result.layouts_made, "departures"_a = result.departures,
      "placed_allocations"_a = result.placed_allocations, "arena_bytes"_a = result.arena_bytes,
      "layout_live_bytes"_a = result.layout_live_bytes, "oom"_a = result.oom,
      "oom_event"_a = if_oom(result.oom_event), "oom_message"_a = if_oom(result.oom_message),
      "ns_per_call_p50"_a = result.ns_per_call_p50, "ns_per_call_p99"_a = result.ns_per_call_p99,
      "seconds"_a = result.seconds, "steps"_a = steps);
}

// `stowage replay`'s "after_warmup": what the steps after the first `warmup` of replay()'s "steps" asked
// of the device, and the worst step's cost on a GPU.
py::dict after_warmup(const py::list& steps, std::int64_t warmup) {
  STOWAGE_CHECK(warmup >= 0, "warmup must be 0 or more steps, not ", warmup);
  const std::size_t first = std::min(static_cast<std::size_t>(warmup), steps.size());
  std::size_t maps = 0, unmaps = 0, device_calls = 0;
  std::uint64_t worst_ns = 0;
  for (std::size_t i = first; i < steps.size(); ++i) {
    const py::handle step = steps[i];
    maps += step["maps"].cast<std::size_t>();
    unmaps += step["unmaps"].cast<std::size_t>();
    device_calls += step["device_calls"].cast<std::size_t>();
    worst_ns = std::max(worst_ns, step["charged_ns"].cast<std::uint64_t>());
  }
  return py::dict("warmup_steps"_a = first, "steps"_a = steps.size() - first, "maps"_a = maps, "unmaps"_a = unmaps,
                  "device_calls"_a = device_calls, "worst_step_ms"_a = static_cast<double>(worst_ns) / 1e6);
}

HostCallCosts costs_named(const std::string& name) {
  if (name == "h100") return HostCallCosts::measured_h100();
  STOWAGE_CHECK(name == "none", "costs must be 'h100' (measured on an H100) or 'none', not '",
                name, "'");
  return {};
}

py::dict min_capacity(const Trace& trace, std::uint64_t peak_requested, const std::string& config,
                      std::optional<std::uint64_t> known_fit, const py::object& progress) {
  const AllocatorConfig parsed = parse_allocator_config(config);
  const auto fits = [&](std::uint64_t capacity) {
    py::gil_scoped_release unlocked;
    return !trace.replay({capacity, parsed, false, HostCallCosts::measured_h100()}).oom;
  };
  std::function<void(std::uint64_t, std::uint64_t)> report;
  if (!progress.is_none()) report = [&](std::uint64_t done, std::uint64_t total) { progress(done, total); };
  const CapacitySearchResult found = search_min_capacity(fits, peak_requested, known_fit, {}, report);
  return py::dict("min_capacity"_a = found.min_capacity, "min_capacity_verified"_a = found.verified,
                  "replays"_a = found.replays);
}

// One of stowage.replay.replay_snapshot's results as its table row reads it.
ReplayTableRow table_row_of(const py::handle& result) {
  const py::handle warm = result["after_warmup"];
  ReplayTableRow row;
  row.trace = result["trace"].cast<std::string>();
  row.device = result["device"].cast<std::int64_t>();
  row.events = result["events"].cast<std::uint64_t>();
  row.skipped_frees = result["skipped_frees"].cast<std::uint64_t>();
  row.peak_requested = result["peak_requested"].cast<std::uint64_t>();
  row.peak_reserved = result["peak_reserved"].cast<std::uint64_t>();
  row.min_capacity = result["min_capacity"].cast<std::optional<std::uint64_t>>();
  row.native_peak_reserved = result["native_peak_reserved"].cast<std::optional<std::uint64_t>>();
  row.native_comparable = result["native_comparable"].cast<bool>();
  row.maps = result["maps"].cast<std::uint64_t>();
  row.unmaps = result["unmaps"].cast<std::uint64_t>();
  row.steps = py::len(result["steps"]);
  row.steps_after_warmup = warm["steps"].cast<std::uint64_t>();
  row.device_calls_after_warmup = warm["device_calls"].cast<std::uint64_t>();
  row.worst_step_ms = warm["worst_step_ms"].cast<double>();
  row.ns_per_call_p50 = result["ns_per_call_p50"].cast<double>();
  row.ns_per_call_p99 = result["ns_per_call_p99"].cast<double>();
  row.events_per_second = result["events_per_second"].cast<std::optional<double>>();
  row.oom = result["oom"].cast<bool>();
  row.layouts_made = result["layouts_made"].cast<std::uint64_t>();
  row.departures = result["departures"].cast<std::uint64_t>();
  row.placed_allocations = result["placed_allocations"].cast<std::uint64_t>();
  row.arena_bytes = result["arena_bytes"].cast<std::uint64_t>();
  row.layout_live_bytes = result["layout_live_bytes"].cast<std::uint64_t>();
  return row;
}

}  // namespace

void bind_replay(py::module_& module) {
  module.attr("capacity_search_step") = CapacitySearchLimits{}.step;
  module.attr("capacity_search_max") = CapacitySearchLimits{}.max_capacity;
  module.def("after_warmup", &after_warmup, py::arg("steps"), py::arg("warmup"),
             "What the steps of ReplayEvents.replay()'s 'steps' after the first `warmup` asked of the device: "
             "{warmup_steps, steps, maps, unmaps, device_calls, worst_step_ms}. Raises LogicError for a negative "
             "warmup.");
  module.def(
      "replay_table",
      [](const py::list& results) {
        std::vector<ReplayTableRow> rows;
        for (const py::handle result : results) rows.push_back(table_row_of(result));
        const ReplayTable table = replay_table(rows);
        return py::make_tuple(table.columns, table.rows, table.notes);
      },
      py::arg("results"),
      "stowage replay's table over replay_snapshot's results (allocator/replay_table.hpp): (columns, rows of text "
      "cells, notes to print under it).");
  py::class_<Trace>(module, "ReplayEvents",
                    "The alloc (kind 0), free (kind 1) and step-end (kind 2) events of one device, in order, "
                    "to replay (allocator/replay.hpp's Trace).")
      .def(py::init(&make_trace), py::arg("kinds"), py::arg("addresses"), py::arg("sizes"),
           py::arg("streams"))
      .def("__len__", [](const Trace& trace) { return trace.events().size(); })
      .def(
          "replay",
          [](const Trace& trace, std::size_t capacity, const std::string& config,
             bool measure_latency, const std::string& costs) {
            const ReplayOptions options{capacity, parse_allocator_config(config), measure_latency,
                                        costs_named(costs)};
            ReplayResult result;
            {
              py::gil_scoped_release unlocked;
              result = trace.replay(options);
            }
            return to_dict(result);
          },
          py::arg("capacity"), py::arg("config") = "", py::arg("measure_latency") = true,
          py::arg("costs") = "h100",
          "Replays the events through a CachingAllocator on a simulated device of `capacity` "
          "bytes; returns the figures as a dict, with what each step asked of the device and "
          "what that would cost a GPU (costs: 'h100', measured on one, or 'none').")
      .def("min_capacity", &min_capacity, py::arg("peak_requested"), py::arg("config") = "",
           py::arg("known_fit") = py::none(), py::arg("progress") = py::none(),
           "The smallest device, in 2 MiB steps, on which the replay completes, searched and then "
           "verified (allocator/capacity_search.hpp): {min_capacity, min_capacity_verified, "
           "replays}. `progress(done, total)` is called as the search bisects.");
}

}  // namespace stowage::python
