// stowage._core's trace analyses (snapshot/: trace steps, alloc/free pairing, categories, the
// inspector's advice, the comparison of two snapshots)
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
#include "snapshot/advice.hpp"
#include "snapshot/advice_evidence.hpp"
#include "snapshot/categories.hpp"
#include "snapshot/device_events.hpp"
#include "snapshot/live_groups.hpp"
#include "snapshot/live_pairs.hpp"
#include "snapshot/live_series.hpp"
#include "snapshot/snapshot_diff.hpp"
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
      "growing_groups",
      [](const Bools& is_alloc, const Int64s& end, const Int64s& size, const Int64s& group, const Int64s& first,
         const Int64s& positions) {
        py::list rows;
        for (const snapshot::Growing& row : snapshot::growing_groups(bytes_of(is_alloc), span_of(end), span_of(size),
                                                                     span_of(group), span_of(first),
                                                                     span_of(positions))) {
          rows.append(py::make_tuple(row.group, int_of(row.bytes_per_step), row.steps));
        }
        return rows;
      },
      py::arg("is_alloc"), py::arg("end"), py::arg("size"), py::arg("group"), py::arg("first"), py::arg("positions"),
      "The groups whose live bytes grew at every one of `positions`: (group, bytes a step, steps) "
      "rows, the largest growth first (snapshot/live_groups.hpp).");
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

// str(value) as UTF-8, a lone surrogate (which a snapshot's strings may hold) as Python's
// surrogatepass writes it; utf8_str() reads it back.
std::string utf8_of(const py::handle& value) {
  const py::str text(value);
  const py::object utf8 = py::reinterpret_steal<py::object>(
      PyUnicode_AsEncodedString(text.ptr(), "utf-8", "surrogatepass"));
  if (!utf8) throw py::error_already_set();
  return utf8.cast<std::string>();
}

py::str utf8_str(const std::string& utf8) {
  PyObject* made = PyUnicode_DecodeUTF8(utf8.data(), static_cast<Py_ssize_t>(utf8.size()), "surrogatepass");
  if (made == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(made);
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

// The optional arrays of advise: None is an empty one.
template <typename Array>
Array optional_array(const py::object& value) {
  const Array out = value.is_none() ? Array(0) : Array::ensure(value);
  if (!out) throw py::error_already_set();
  return out;
}

py::list advice_rows(const std::vector<snapshot::Advice>& found) {
  py::list rows;
  for (const snapshot::Advice& row : found) {
    py::dict out;
    out["rule"] = row.rule;
    out["waste_bytes"] = int_of(row.waste);
    out["saving_bytes"] = int_of(row.saving);
    if (row.upper_bound) out["upper_bound"] = *row.upper_bound;
    out["advice"] = utf8_str(row.text);
    rows.append(out);
  }
  return rows;
}

void bind_advice(py::module_& module) {
  module.attr("advice_min_share") = snapshot::kMinShare;
  module.attr("advice_loss_chunks") = snapshot::kLossChunks;
  module.def(
      "all_categories",
      [](const Flags& flags, const StackColumn& stack, const Int64s& index, const Bools& is_alloc, const Int64s& end,
         const Int64s& step_starts) {
        return array_of(snapshot::all_categories(
            {span_of(flags), span_of(stack), span_of(index), bytes_of(is_alloc), span_of(end), span_of(step_starts)}));
      },
      py::arg("flags"), py::arg("stack"), py::arg("index"), py::arg("is_alloc"), py::arg("end"),
      py::arg("step_starts"), "Every position's category (int8; unknown at frees), with marked flags.");
  module.def(
      "advise",
      [](const py::array& live, const Bools& is_alloc, const Int64s& end, const Int64s& size, const Int64s& own,
         const Int64s& index, const StackColumn& stack, const Flags& flags, const py::object& marked,
         const Int64s& step_starts, const Int64s& site, const py::object& exact_category, const py::object& block,
         std::size_t blocks, const py::str& first_block, const py::int_& peak_bytes, std::int64_t peak_position,
         const Int64s& live_at, const Flags& category_at, const py::dict& peak_categories, const py::list& growing,
         const py::object& oom) {
        const LiveArgument series(live);
        const Flags marked_flags = optional_array<Flags>(marked), exact = optional_array<Flags>(exact_category);
        const Int64s blocks_of = optional_array<Int64s>(block);
        const snapshot::AdviceTrace trace{series.series(), bytes_of(is_alloc), span_of(end), span_of(size),
                                          span_of(own), span_of(index), span_of(stack), span_of(flags),
                                          span_of(marked_flags), !marked.is_none(), span_of(step_starts),
                                          span_of(site), span_of(exact), span_of(blocks_of), blocks};
        snapshot::AdvicePeak peak{wide_of(peak_bytes), peak_position, span_of(live_at), span_of(category_at), {},
                                  utf8_of(first_block)};
        for (std::size_t k = 0; k < std::size(snapshot::kCategoryNames); ++k) {
          const py::str name(snapshot::kCategoryNames[k]);
          if (peak_categories.contains(name)) peak.by_category[k] = wide_of(peak_categories[name]);
        }
        std::vector<snapshot::GrowingSite> sites;
        for (const py::handle row : growing) {
          const auto fields = row.cast<py::tuple>();
          sites.push_back({fields[0].cast<std::int64_t>(), utf8_of(fields[1]), wide_of(fields[2]),
                           fields[3].cast<std::int64_t>()});
        }
        std::optional<snapshot::OomFacts> facts;
        if (!oom.is_none()) {
          const auto fields = oom.cast<py::tuple>();
          facts = snapshot::OomFacts{wide_of(fields[0]), wide_of(fields[1]), wide_of(fields[2]), std::nullopt,
                                     fields[4].cast<bool>()};
          if (!fields[3].is_none()) facts->replayed_reserved = wide_of(fields[3]);
        }
        snapshot::AdviceEvidence evidence(trace);
        return advice_rows(snapshot::advise(evidence, peak, sites, facts));
      },
      py::arg("live"), py::arg("is_alloc"), py::arg("end"), py::arg("size"), py::arg("own"), py::arg("index"),
      py::arg("stack"), py::arg("flags"), py::arg("marked"), py::arg("step_starts"), py::arg("site"),
      py::arg("exact_category"), py::arg("block"), py::arg("blocks"), py::arg("first_block"), py::arg("peak_bytes"),
      py::arg("peak_position"), py::arg("live_at"), py::arg("category_at"), py::arg("peak_categories"),
      py::arg("growing"), py::arg("oom"),
      "The inspector's advice (snapshot/advice.hpp) as rows: rule, waste_bytes, saving_bytes, "
      "upper_bound (where the saving may be a bound) and advice, largest saving first. `marked`: "
      "the flags with autograd's thread marked (None: no Python frames); `growing`: (site id, name, "
      "bytes a step, steps) rows; `oom`: (requested, device_free, cached_free, replayed peak "
      "reserved or None, recorded under stowage's allocator) of the run's first out-of-memory, or "
      "None.");
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
  bind_steps(module);
}

}  // namespace stowage::python
