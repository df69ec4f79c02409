// stowage._core.ReplayEvents: one device's alloc, free and step-end events, replayed in C++ without the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "allocator/capacity_search.hpp"
#include "allocator/config.hpp"
#include "allocator/replay.hpp"
#include "base/errors.hpp"
#include "python/bindings/bindings.hpp"

namespace py = pybind11;

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
  py::dict out;
  out["events"] = result.events;
  out["allocs"] = result.allocs;
  out["frees"] = result.frees;
  out["skipped_frees"] = result.skipped_frees;
  out["zero_size"] = result.zero_size;
  out["implicit_frees"] = result.implicit_frees;
  out["peak_requested"] = result.peak_requested;
  out["peak_allocated"] = result.peak_allocated;
  out["peak_reserved"] = result.peak_reserved;
  out["peak_mapped_pages"] = result.peak_mapped_pages;
  out["maps"] = result.maps;
  out["unmaps"] = result.unmaps;
  out["layouts_made"] = result.layouts_made;
  out["departures"] = result.departures;
  out["placed_allocations"] = result.placed_allocations;
  out["arena_bytes"] = result.arena_bytes;
  out["layout_live_bytes"] = result.layout_live_bytes;
  out["oom"] = result.oom;
  out["oom_event"] = result.oom ? py::object(py::int_(result.oom_event)) : py::object(py::none());
  out["oom_message"] = result.oom ? py::object(py::str(result.oom_message)) : py::object(py::none());
  out["ns_per_call_p50"] = result.ns_per_call_p50;
  out["ns_per_call_p99"] = result.ns_per_call_p99;
  out["seconds"] = result.seconds;
  py::list steps;
  for (const ReplayStep& step : result.steps) {
    py::dict entry;
    entry["maps"] = step.maps;
    entry["unmaps"] = step.unmaps;
    entry["device_calls"] = step.device_calls;
    entry["charged_ns"] = step.charged_ns;
    entry["reserved"] = step.reserved;
    steps.append(entry);
  }
  out["steps"] = steps;
  return out;
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
  py::dict out;
  out["min_capacity"] = found.min_capacity ? py::object(py::int_(*found.min_capacity)) : py::object(py::none());
  out["min_capacity_verified"] = found.verified;
  out["replays"] = found.replays;
  return out;
}

}  // namespace

void bind_replay(py::module_& module) {
  module.attr("capacity_search_step") = CapacitySearchLimits{}.step;
  module.attr("capacity_search_max") = CapacitySearchLimits{}.max_capacity;
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
