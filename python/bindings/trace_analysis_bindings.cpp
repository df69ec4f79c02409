// stowage._core's trace analyses over a trace's columns as numpy arrays (snapshot/: alloc/free
// pairing, categories and live bytes by group for the HTML report's timelines, replay's device
// events, the comparison of two snapshots): conversions only. Positions arrive as any integer
// array (int32 or int64); byte counts leave as Python ints.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "allocator/base/errors.hpp"
#include "python/bindings/bindings.hpp"
#include "python/bindings/python_values.hpp"
#include "snapshot/advice_evidence.hpp"
#include "snapshot/categories.hpp"
#include "snapshot/device_events.hpp"
#include "snapshot/live_groups.hpp"
#include "snapshot/live_pairs.hpp"
#include "snapshot/live_series.hpp"
#include "snapshot/snapshot_diff.hpp"

namespace py = pybind11;

namespace stowage::python {

namespace {

using snapshot::Wide;
using Int64s = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>;
using Bools = py::array_t<bool, py::array::c_style | py::array::forcecast>;
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

std::span<const std::uint8_t> bytes_of(const Bools& values) {
  return {reinterpret_cast<const std::uint8_t*>(values.data()), static_cast<std::size_t>(values.size())};
}

template <typename Position>
py::tuple pairs_of(std::span<const std::uint8_t> action, std::span<const std::uint64_t> addr,
                   std::span<const std::uint64_t> size) {
  const auto n = static_cast<py::ssize_t>(snapshot::count_positions(action));
  py::array_t<Position> index(n), alloc_of(n), end(n);
  py::array_t<bool> is_alloc(n);
  py::array_t<std::int64_t> sizes(n), own(n), unknown(n);
  const auto span = [n](auto& array) { return std::span(array.mutable_data(), static_cast<std::size_t>(n)); };
  const snapshot::LivePairsOut<Position> out{
      span(index), std::span(reinterpret_cast<std::uint8_t*>(is_alloc.mutable_data()), static_cast<std::size_t>(n)),
      span(sizes), span(own), span(unknown), span(alloc_of), span(end)};
  {
    py::gil_scoped_release released;
    snapshot::pair_allocations(action, addr, size, out);
  }
  return py::make_tuple(index, is_alloc, sizes, own, unknown, alloc_of, end);
}

void bind_pairs(py::module_& module) {
  using Actions = py::array_t<std::uint8_t, py::array::c_style | py::array::forcecast>;
  module.def(
      "grouped_live",
      [](const Int64s& own, const Int64s& unknown, const Bools& is_alloc, const Int64s& alloc_of, const Int64s& group,
         std::size_t groups, std::size_t max_points) {
        const snapshot::GroupedLive found = snapshot::grouped_live(span_of(own), span_of(unknown), bytes_of(is_alloc),
                                                                   span_of(alloc_of), span_of(group), groups, max_points);
        const auto ints = [](const std::vector<Wide>& values) {
          py::list out;
          for (const Wide value : values) out.append(int_of(value));
          return out;
        };
        py::list series;
        for (const auto& values : found.series) series.append(ints(values));
        return py::make_tuple(array_of(found.positions), found.peak, ints(found.unknown_freed), series);
      },
      py::arg("own"), py::arg("unknown"), py::arg("is_alloc"), py::arg("alloc_of"), py::arg("group"), py::arg("groups"),
      py::arg("max_points"),
      "Live bytes by group, sampled: (positions, the peak's position, unknown frees' bytes so far and "
      "each group's live bytes at each sample).");
  module.def(
      "live_pairs",
      [](const Actions& action, const Bytes& addr, const Bytes& size) {
        const std::span<const std::uint8_t> actions(action.data(), static_cast<std::size_t>(action.size()));
        if (actions.size() < (std::size_t{1} << 31)) return pairs_of<std::int32_t>(actions, span_of(addr), span_of(size));
        return pairs_of<std::int64_t>(actions, span_of(addr), span_of(size));
      },
      py::arg("action"), py::arg("addr"), py::arg("size"),
      "A trace's alloc and free_completed events paired: (index, is_alloc, size, own, unknown, "
      "alloc_of, end), positions int32 below 2**31 events (stowage.inspection.timelines.LivePairs).");
}

// The stack flags of each stack (snapshot/categories.hpp), its frames read as Python reads them.
py::array_t<std::int8_t> stack_flags_of(const py::list& stacks) {
  const auto text = [](const py::handle& frame, const char* key) { return utf8_of(frame.attr("get")(key, "")); };
  py::array_t<std::int8_t> out(static_cast<py::ssize_t>(stacks.size()));
  std::vector<snapshot::FrameNames> frames;
  for (std::size_t k = 0; k < stacks.size(); ++k) {
    frames.clear();
    const py::object stack = stacks[k];
    const int frames_given = PyObject_IsTrue(stack.ptr());  // (frames or (): None and [] have none)
    if (frames_given < 0) throw py::error_already_set();
    if (frames_given == 1) {
      for (const py::handle frame : stack) {
        std::string filename = text(frame, "filename");
        frames.push_back({std::move(filename), text(frame, "name")});
      }
    }
    out.mutable_data()[k] = snapshot::stack_flags(frames);
  }
  return out;
}

void bind_categories(py::module_& module) {
  using Stacks = py::array_t<std::int32_t, py::array::c_style | py::array::forcecast>;
  py::tuple names(std::size(snapshot::kCategoryNames));
  for (std::size_t k = 0; k < std::size(snapshot::kCategoryNames); ++k) names[k] = snapshot::kCategoryNames[k];
  module.attr("category_names") = names;
  module.def("stack_flags", &stack_flags_of, py::arg("stacks"),
             "The stack flags (int8) of each stack: a list of frames (dicts), or None.");
  module.def(
      "mark_autograd_thread",
      [](py::array flags, const Stacks& stack, const Int64s& index, const Bools& is_alloc) {
        STOWAGE_CHECK(flags.dtype().is(py::dtype::of<std::int8_t>()) && flags.writeable() &&
                          (flags.flags() & py::array::c_style) != 0 && flags.ndim() == 1,
                      "flags must be a writeable, contiguous int8 array");
        const std::span<std::int8_t> marked(static_cast<std::int8_t*>(flags.mutable_data()),
                                            static_cast<std::size_t>(flags.size()));
        return snapshot::mark_autograd_thread(marked, span_of(stack), span_of(index), bytes_of(is_alloc));
      },
      py::arg("flags"), py::arg("stack"), py::arg("index"), py::arg("is_alloc"),
      "Marks autograd's thread's events backward's in `flags` (in place); False (nothing marked) "
      "where the trace has no Python frames to read.");
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

void bind_advice(py::module_& module) {
  module.def(
      "all_categories",
      [](const Flags& flags, const StackColumn& stack, const Int64s& index, const Bools& is_alloc, const Int64s& end,
         const Int64s& step_starts) {
        return array_of(snapshot::all_categories(
            {span_of(flags), span_of(stack), span_of(index), bytes_of(is_alloc), span_of(end), span_of(step_starts)}));
      },
      py::arg("flags"), py::arg("stack"), py::arg("index"), py::arg("is_alloc"), py::arg("end"),
      py::arg("step_starts"), "Every position's category (int8; unknown at frees), with marked flags.");
}

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
  bind_advice(module);
  bind_snapshot_diff(module);
  bind_device_events(module);
  bind_categories(module);
  bind_pairs(module);
}

}  // namespace stowage::python
