// stowage._core's trace analyses besides the inspector's findings (snapshot/: replay's device
// events, the comparison of two snapshots): conversions only; byte counts leave as Python ints.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <span>
#include <vector>

#include "python/bindings/bindings.hpp"
#include "python/bindings/python_values.hpp"
#include "snapshot/device_events.hpp"
#include "snapshot/live_series.hpp"
#include "snapshot/snapshot_diff.hpp"

namespace py = pybind11;

namespace stowage::python {

namespace {

using snapshot::Wide;
using Int64s = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>;
using Bytes = py::array_t<std::uint64_t, py::array::c_style | py::array::forcecast>;

template <typename T>
std::span<const T> span_of(const py::array_t<T, py::array::c_style | py::array::forcecast>& values) {
  return {values.data(), static_cast<std::size_t>(values.size())};
}

template <typename T>
py::array_t<T> array_of(const std::vector<T>& values) {
  py::array_t<T> out(static_cast<py::ssize_t>(values.size()));
  std::copy(values.begin(), values.end(), out.mutable_data());
  return out;
}

void bind_device_events(py::module_& module) {
  using Actions = py::array_t<std::uint8_t, py::array::c_style | py::array::forcecast>;
  const auto view = [](const Actions& action, const Bytes& addr, const Bytes& size, const Bytes& stream) {
    return snapshot::TraceColumnsView{{action.data(), static_cast<std::size_t>(action.size())}, span_of(addr),
                                      span_of(size), span_of(stream)};
  };
  module.def(
      "device_event_arrays",
      [view](const Actions& action, const Bytes& addr, const Bytes& size, const Bytes& stream, const Int64s& marks) {
        const snapshot::TraceColumnsView columns = view(action, addr, size, stream);
        const auto n = static_cast<py::ssize_t>(snapshot::count_device_events(columns, span_of(marks)));
        py::array_t<std::uint8_t> kinds(n);
        py::array_t<std::uint64_t> addrs(n), sizes(n), streams(n);
        const auto out = [n](auto& array) { return std::span(array.mutable_data(), static_cast<std::size_t>(n)); };
        snapshot::fill_device_events(columns, span_of(marks), out(kinds), out(addrs), out(sizes), out(streams));
        return py::make_tuple(kinds, addrs, sizes, streams);
      },
      py::arg("action"), py::arg("addr"), py::arg("size"), py::arg("stream"), py::arg("step_marks"),
      "A device's alloc, free_completed and step-end events as stowage._core.Trace's arrays.");
  module.def(
      "reserved_peak",
      [](const Actions& action, const Bytes& addr, const Bytes& size) {
        const snapshot::ReservedPeak found = snapshot::reserved_peak(
            {action.data(), static_cast<std::size_t>(action.size())}, span_of(addr), span_of(size));
        return py::make_tuple(found.peak ? py::object(int_of(*found.peak)) : py::none(), array_of(found.created));
      },
      py::arg("action"), py::arg("addr"), py::arg("size"),
      "The peak of the trace's segment growth (None without segment events), and the addresses of "
      "the segments it created.");
  module.def(
      "step_period",
      [](const Actions& kinds, const Bytes& sizes) -> py::object {
        const auto found = snapshot::step_period({kinds.data(), static_cast<std::size_t>(kinds.size())}, span_of(sizes));
        return found ? py::object(py::int_(*found)) : py::none();
      },
      py::arg("kinds"), py::arg("sizes"), "The number of steps after which the steps repeat, or None.");
}

using Flags = py::array_t<std::int8_t, py::array::c_style | py::array::forcecast>;
using StackColumn = py::array_t<std::int32_t, py::array::c_style | py::array::forcecast>;

void bind_snapshot_diff(py::module_& module) {
  module.def(
      "diff_sites",
      [](const py::list& before, const py::list& after, std::size_t top) {
        const auto sites = [](const py::list& rows) {
          std::vector<snapshot::SiteBytes> out;
          for (const py::handle row : rows) {
            const auto fields = row.cast<py::tuple>();
            out.push_back({utf8_of(fields[0]), wide_of(fields[1])});
          }
          return out;
        };
        const snapshot::SitesDiff found = snapshot::diff_sites(sites(before), sites(after), top);
        const auto rows = [](const std::vector<snapshot::SiteChange>& changes) {
          py::list out;
          for (const snapshot::SiteChange& change : changes) {
            py::dict row;
            row["site"] = utf8_str(change.site);
            row["before"] = int_of(change.before);
            row["after"] = int_of(change.after);
            row["change"] = int_of(change.change);
            out.append(row);
          }
          return out;
        };
        return py::make_tuple(rows(found.grew), rows(found.shrank));
      },
      py::arg("before"), py::arg("after"), py::arg("top"),
      "Sites' live bytes at the end compared ((site, bytes) rows each): the `top` that grew and "
      "that shrank, as stowage.diff's rows (snapshot/snapshot_diff.hpp).");
  module.def(
      "diff_segments",
      [](const py::list& before, const py::list& after, std::size_t top) {
        const auto segments = [](const py::list& rows) {
          std::vector<snapshot::SegmentFacts> out;
          for (const py::handle row : rows) {
            const auto fields = row.cast<py::tuple>();
            out.push_back({wide_of(fields[0]), wide_of(fields[1]), fields[2].cast<bool>(), wide_of(fields[3])});
          }
          return out;
        };
        const snapshot::SegmentsDiff found = snapshot::diff_segments(segments(before), segments(after), top);
        const auto side = [](std::size_t count, snapshot::Wide bytes) {
          py::dict out;
          out["count"] = count;
          out["bytes"] = int_of(bytes);
          return out;
        };
        py::list changed;
        for (const snapshot::SegmentChange& change : found.changed) {
          py::dict row;
          row["address"] = int_of(change.address);
          row["size_before"] = int_of(change.size_before);
          row["size_after"] = int_of(change.size_after);
          row["live_before"] = int_of(change.live_before);
          row["live_after"] = int_of(change.live_after);
          row["live_change"] = int_of(change.live_change);
          changed.append(row);
        }
        py::dict out;
        out["only_before"] = side(found.only_before, found.only_before_bytes);
        out["only_after"] = side(found.only_after, found.only_after_bytes);
        out["changed"] = changed;
        out["changed_count"] = found.changed_count;
        return out;
      },
      py::arg("before"), py::arg("after"), py::arg("top"),
      "Segments compared ((address, total_size, is_expandable, live bytes) rows each): those given "
      "back, the new and the `top` changed in place, as stowage.diff's (snapshot/snapshot_diff.hpp).");
}

}  // namespace

void bind_trace_analysis(py::module_& module) {
  bind_snapshot_diff(module);
  bind_device_events(module);
}

}  // namespace stowage::python
