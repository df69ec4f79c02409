// stowage._core's trace analyses (snapshot/: trace steps, peak estimates, alloc/free pairing)
// over a trace's columns as numpy arrays: conversions only. Positions arrive as any integer
// array (int32 or int64); a live-bytes series as int64, or as Python's integers (an object array)
// where it passes int64 (Note [Live bytes in 128 bits]); byte counts leave as Python ints.
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
#include "snapshot/categories.hpp"
#include "snapshot/device_events.hpp"
#include "snapshot/live_groups.hpp"
#include "snapshot/live_pairs.hpp"
#include "snapshot/live_series.hpp"
#include "snapshot/peak_estimates.hpp"
#include "snapshot/recompute_estimate.hpp"
#include "snapshot/trace_steps.hpp"

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

Wide wide_of(const py::handle& value) {
  int overflow = 0;
  const long long narrow = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
  if (narrow == -1 && PyErr_Occurred() != nullptr) throw py::error_already_set();
  if (overflow == 0) return Wide{narrow};
  const py::int_ whole = py::reinterpret_borrow<py::int_>(value);
  const py::object high = whole.attr("__rshift__")(64);
  const long long high_part = PyLong_AsLongLongAndOverflow(high.ptr(), &overflow);
  STOWAGE_CHECK(overflow == 0 && high_part >= -(1LL << 62) && high_part < (1LL << 62),
                "a live-bytes value past 2**126 cannot be a trace's");
  const auto low = whole.attr("__and__")(py::int_(std::numeric_limits<std::uint64_t>::max())).cast<std::uint64_t>();
  return Wide{high_part} * (Wide{1} << 64) + Wide{low};
}

py::int_ int_of(Wide value) {
  if (value >= std::numeric_limits<std::int64_t>::min() && value <= std::numeric_limits<std::int64_t>::max()) {
    return py::int_(static_cast<std::int64_t>(value));
  }
  const auto high = static_cast<std::int64_t>(value >> 64);  // (arithmetic shift: floor)
  const auto low = static_cast<std::uint64_t>(value - (Wide{high} << 64));
  return py::reinterpret_steal<py::int_>(
      (py::int_(high).attr("__lshift__")(64).attr("__or__")(py::int_(low))).release());
}

// A live-bytes series from numpy: int64 read in place, Python's integers widened.
class LiveArgument {
 public:
  explicit LiveArgument(const py::array& values) {
    if (values.dtype().kind() == 'O') {
      for (const py::handle value : values) wide_.push_back(wide_of(value));
      series_ = snapshot::LiveSeries(std::span<const Wide>(wide_));
    } else {
      narrow_ = Int64s::ensure(values);
      if (!narrow_) throw py::error_already_set();
      series_ = snapshot::LiveSeries(span_of(narrow_));
    }
  }
  const snapshot::LiveSeries& series() const { return series_; }

 private:
  Int64s narrow_;
  std::vector<Wide> wide_;
  snapshot::LiveSeries series_;
};

std::vector<std::int64_t> list_of(const Int64s& values) {
  const auto values_span = span_of(values);
  return {values_span.begin(), values_span.end()};
}

snapshot::StepMarks marks_of(const Int64s& steps, const Int64s& trial_begins, const Int64s& trial_ends,
                             std::int64_t events) {
  return {list_of(steps), list_of(trial_begins), list_of(trial_ends), events};
}

py::tuple steps_of(const snapshot::Steps& found) {
  py::list rows;
  for (const snapshot::Step& step : found.steps) {
    rows.append(py::make_tuple(step.number, step.first_event, step.last_event, int_of(step.peak_bytes),
                               step.peak_event, int_of(step.end_bytes), step.fit_trial));
  }
  return py::make_tuple(rows, found.found_by);
}

void bind_steps(py::module_& module) {
  module.def(
      "in_trial",
      [](const Int64s& trial_begins, const Int64s& trial_ends, std::int64_t events, const Int64s& index) {
        const std::vector<std::uint8_t> inside = snapshot::in_trial(marks_of(Int64s(0), trial_begins, trial_ends, events),
                                                                    span_of(index));
        py::array_t<bool> out(static_cast<py::ssize_t>(inside.size()));
        std::copy(inside.begin(), inside.end(), out.mutable_data());
        return out;
      },
      py::arg("trial_begins"), py::arg("trial_ends"), py::arg("events"), py::arg("index"),
      "For each event index, whether it lies inside one of stowage.fit's trial spans.");
  module.def(
      "cut_steps",
      [](const Int64s& steps, const Int64s& trial_begins, const Int64s& trial_ends, std::int64_t events,
         const Int64s& index, const py::array& live, const Bools& is_alloc, const Int64s& size) {
        const LiveArgument series(live);
        return steps_of(snapshot::cut_steps(marks_of(steps, trial_begins, trial_ends, events), span_of(index),
                                            series.series(), bytes_of(is_alloc), span_of(size)));
      },
      py::arg("steps"), py::arg("trial_begins"), py::arg("trial_ends"), py::arg("events"), py::arg("index"),
      py::arg("live"), py::arg("is_alloc"), py::arg("size"),
      "A trace's steps as (number, first_event, last_event, peak_bytes, peak_event, end_bytes, "
      "fit_trial) rows, and how they were found (stowage.trace_steps).");
}

void bind_peak_estimates(py::module_& module) {
  module.def(
      "changed_peak",
      [](const py::array& live, const Int64s& change) {
        return int_of(snapshot::changed_peak(LiveArgument(live).series(), span_of(change)));
      },
      py::arg("live"), py::arg("change"), "The series' peak with `change` added to its running sum.");
  module.def(
      "removed_peak",
      [](const py::array& live, const Int64s& end, const Int64s& size, const Int64s& removed) {
        return int_of(snapshot::removed_peak(LiveArgument(live).series(), span_of(end), span_of(size),
                                             span_of(removed)));
      },
      py::arg("live"), py::arg("end"), py::arg("size"), py::arg("removed"),
      "The series' peak with the allocations `removed` taken out over their lives.");
  module.def(
      "freed_when_made_peak",
      [](const py::array& live, const Int64s& end, const Int64s& size, const Int64s& kept, const Int64s& backward,
         const Int64s& step_starts) {
        return int_of(snapshot::freed_when_made_peak(LiveArgument(live).series(), span_of(end), span_of(size),
                                                     span_of(kept), span_of(backward), span_of(step_starts)));
      },
      py::arg("live"), py::arg("end"), py::arg("size"), py::arg("kept"), py::arg("backward_allocs"),
      py::arg("step_starts"), "The series' peak with the allocations `kept` freed as soon as they are made.");
  module.def(
      "grads_set_to_none_peak",
      [](const py::array& live, const Bools& is_alloc, const Int64s& end, const Int64s& size, const Int64s& kept,
         const Int64s& backward, const Int64s& step_starts) {
        return int_of(snapshot::grads_set_to_none_peak(LiveArgument(live).series(), bytes_of(is_alloc), span_of(end),
                                                       span_of(size), span_of(kept), span_of(backward),
                                                       span_of(step_starts)));
      },
      py::arg("live"), py::arg("is_alloc"), py::arg("end"), py::arg("size"), py::arg("kept"),
      py::arg("backward_allocs"), py::arg("step_starts"),
      "The series' peak with the gradients `kept` set to None at each step's end.");
  module.def(
      "checkpointed_peak",
      [](const py::array& live, const Bools& is_alloc, const Int64s& end, const Int64s& size, const Int64s& own,
         const Int64s& activations, const Int64s& block) {
        return int_of(snapshot::checkpointed_peak(LiveArgument(live).series(), bytes_of(is_alloc), span_of(end),
                                                  span_of(size), span_of(own), span_of(activations), span_of(block)));
      },
      py::arg("live"), py::arg("is_alloc"), py::arg("end"), py::arg("size"), py::arg("own"), py::arg("activations"),
      py::arg("block"), "The series' peak with each block (`block`: every position's, -1 none) checkpointed.");
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
      "live_at",
      [](const Bools& is_alloc, const Int64s& end, const Int64s& size, const Int64s& group, std::size_t groups,
         std::int64_t position) {
        const snapshot::LiveAt found =
            snapshot::live_at(bytes_of(is_alloc), span_of(end), span_of(size), span_of(group), groups, position);
        py::list bytes;
        for (const Wide value : found.bytes) bytes.append(int_of(value));
        return py::make_tuple(bytes, array_of(found.count));
      },
      py::arg("is_alloc"), py::arg("end"), py::arg("size"), py::arg("group"), py::arg("groups"), py::arg("position"),
      "Live bytes (Python ints) and allocations (int64) by group just after `position`.");
  module.def(
      "live_pairs",
      [](const Actions& action, const Bytes& addr, const Bytes& size) {
        const std::span<const std::uint8_t> actions(action.data(), static_cast<std::size_t>(action.size()));
        if (actions.size() < (std::size_t{1} << 31)) return pairs_of<std::int32_t>(actions, span_of(addr), span_of(size));
        return pairs_of<std::int64_t>(actions, span_of(addr), span_of(size));
      },
      py::arg("action"), py::arg("addr"), py::arg("size"),
      "A trace's alloc and free_completed events paired: (index, is_alloc, size, own, unknown, "
      "alloc_of, end), positions int32 below 2**31 events (stowage.inspector.LivePairs).");
}

void bind_categories(py::module_& module) {
  using Stacks = py::array_t<std::int32_t, py::array::c_style | py::array::forcecast>;
  py::dict bits;
  for (const auto& [name, value] : {std::pair{"PYTHON", snapshot::kPython}, {"OPTIMIZER", snapshot::kOptimizer},
                                    {"BACKWARD", snapshot::kBackward}, {"MODULE", snapshot::kModule},
                                    {"ZERO_GRAD", snapshot::kZeroGrad}, {"LIBRARY_NN", snapshot::kLibraryNn},
                                    {"LOSS", snapshot::kLoss}}) {
    bits[name] = value;
  }
  module.attr("stack_flag_bits") = bits;
  py::tuple names(std::size(snapshot::kCategoryNames));
  for (std::size_t k = 0; k < std::size(snapshot::kCategoryNames); ++k) names[k] = snapshot::kCategoryNames[k];
  module.attr("category_names") = names;
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
  module.def(
      "infer_categories",
      [](const py::array_t<std::int8_t, py::array::c_style | py::array::forcecast>& flags, const Stacks& stack,
         const Int64s& index, const Bools& is_alloc, const Int64s& end, const Int64s& step_starts,
         const Int64s& positions) {
        const snapshot::CategoryInputs inputs{span_of(flags), span_of(stack), span_of(index), bytes_of(is_alloc),
                                              span_of(end), span_of(step_starts)};
        return array_of(snapshot::infer_categories(inputs, span_of(positions)));
      },
      py::arg("flags"), py::arg("stack"), py::arg("index"), py::arg("is_alloc"), py::arg("end"),
      py::arg("step_starts"), py::arg("positions"),
      "The category (int8, category_names' order) of the allocations at `positions`.");
  module.def(
      "kept_without_backward",
      [](const py::array_t<std::int8_t, py::array::c_style | py::array::forcecast>& flags, const Stacks& stack,
         const Int64s& index, const Bools& is_alloc, const Int64s& end, const py::object& saved) {
        const snapshot::CategoryInputs inputs{span_of(flags), span_of(stack), span_of(index), bytes_of(is_alloc),
                                              span_of(end), {}};
        const Bools chosen = saved.is_none() ? Bools(0) : Bools::ensure(saved);
        if (!chosen) throw py::error_already_set();
        return array_of(snapshot::kept_without_backward(inputs, bytes_of(chosen)));
      },
      py::arg("flags"), py::arg("stack"), py::arg("index"), py::arg("is_alloc"), py::arg("end"), py::arg("saved"),
      "The allocations a forward left with no backward (`saved`: a mask of those autograd saved, or None).");
  module.def(
      "freed_in_backward",
      [](const Int64s& backward, const Int64s& end, const Int64s& step_starts, const Int64s& positions) {
        const std::vector<std::uint8_t> found =
            snapshot::freed_in_backward(span_of(backward), span_of(end), span_of(step_starts), span_of(positions));
        py::array_t<bool> out(static_cast<py::ssize_t>(found.size()));
        std::copy(found.begin(), found.end(), out.mutable_data());
        return out;
      },
      py::arg("backward_allocs"), py::arg("end"), py::arg("step_starts"), py::arg("positions"),
      "Whether each allocation at `positions` is freed in a backward.");
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

}  // namespace

void bind_trace_analysis(py::module_& module) {
  bind_device_events(module);
  bind_categories(module);
  bind_pairs(module);
  bind_steps(module);
  bind_peak_estimates(module);
}

}  // namespace stowage::python
