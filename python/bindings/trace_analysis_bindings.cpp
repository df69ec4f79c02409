// stowage._core's trace analyses (snapshot/): `stowage inspect`'s findings about one device in one
// call (inspection.hpp), from its trace's columns (stowage.snapshot_reader.TraceColumns) and its
// segments (the snapshot's dicts), as one bound object; replay's device events; the comparison of
// two snapshots. Conversions only: fields are read as Python reads them (int(), str(), a missing
// key a KeyError), byte counts leave as Python ints (Note [Live bytes in 128 bits]), strings as the
// snapshot held them (a lone surrogate as Python's surrogatepass writes it).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/errors.hpp"
#include "python/bindings/bindings.hpp"
#include "python/bindings/python_objects.hpp"
#include "snapshot/categories.hpp"
#include "snapshot/device_events.hpp"
#include "snapshot/diff_report.hpp"
#include "snapshot/findings_rows.hpp"
#include "snapshot/inspection.hpp"
#include "snapshot/native_figures.hpp"
#include "snapshot/profiler_order.hpp"
#include "snapshot/recompute_estimate.hpp"
#include "snapshot/tags_reader.hpp"
#include "snapshot/snapshot_diff.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace stowage::python {

namespace {

using snapshot::Wide;
template <typename T>
using Column = py::array_t<T, py::array::c_style | py::array::forcecast>;
using Int64s = Column<std::int64_t>;
using Bytes = Column<std::uint64_t>;

template <typename T>
std::span<const T> span_of(const Column<T>& values) {
  return {values.data(), static_cast<std::size_t>(values.size())};
}

template <typename T>
py::array_t<T> array_of(const std::vector<T>& values) {
  py::array_t<T> out(static_cast<py::ssize_t>(values.size()));
  std::copy(values.begin(), values.end(), out.mutable_data());
  return out;
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

// str(value) as UTF-8, a lone surrogate (which a snapshot's strings may hold) as Python's
// surrogatepass writes it.
std::string utf8_of(const py::handle& value) {
  const py::str text(value);
  const py::object utf8 = py::reinterpret_steal<py::object>(
      PyUnicode_AsEncodedString(text.ptr(), "utf-8", "surrogatepass"));
  if (!utf8) throw py::error_already_set();
  return utf8.cast<std::string>();
}

// utf8_of's string back as Python's.
py::str utf8_str(const std::string& utf8) {
  PyObject* made = PyUnicode_DecodeUTF8(utf8.data(), static_cast<Py_ssize_t>(utf8.size()), "surrogatepass");
  if (made == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(made);
}

// site_name() of a frame (`get`: its get method).
std::string site_of_frame(const py::object& get, const py::object& missing) {
  const py::object name = get("name", missing);
  return snapshot::site_name({utf8_of(get("filename", "")), utf8_of(get("line", 0)),
                              name.is(missing) ? std::string() : utf8_of(name), !name.is(missing)});
}

// A stack's frames (a list of dicts; None or empty: none), read as stowage's sites name them:
// each frame's filename and name, and the line of the frame that names the site alone
// (`missing`: an object no frame holds, for a name the frame lacks).
std::vector<snapshot::Frame> frames_of(const py::handle& stack, const py::object& missing) {
  std::vector<snapshot::Frame> frames;
  const int given = PyObject_IsTrue(stack.ptr());
  if (given < 0) throw py::error_already_set();
  if (given == 0) return frames;
  std::vector<py::object> gets;
  for (const py::handle frame : stack) {
    const py::object get = frame.attr("get");
    const py::object name = get("name", missing);
    const bool has_name = !name.is(missing);
    frames.push_back({utf8_of(get("filename", "")), "", has_name ? utf8_of(name) : std::string(), has_name});
    gets.push_back(get);
  }
  if (const auto chosen = snapshot::site_frame(frames)) frames[*chosen].line = utf8_of(gets[*chosen]("line", 0));
  return frames;
}

// The event columns of one device's trace (TraceColumns), held for the call, and its marks.
struct EventColumns {
  explicit EventColumns(const py::object& trace)
      : action(Column<std::uint8_t>::ensure(trace.attr("action"))),
        addr(Column<std::uint64_t>::ensure(trace.attr("addr"))),
        size(Column<std::uint64_t>::ensure(trace.attr("size"))),
        stream(Column<std::uint64_t>::ensure(trace.attr("stream"))) {
    if (!action || !addr || !size || !stream) throw py::error_already_set();
    marks.events = static_cast<std::int64_t>(action.size());
    const py::str step(snapshot::kMarkStep), begin(snapshot::kTrialBegin), end(snapshot::kTrialEnd);
    for (const auto [index, value] : trace.attr("user_metadata").cast<py::dict>()) {
      if (!py::isinstance<py::str>(value)) continue;
      const auto event = index.cast<std::int64_t>();
      if (value.equal(step)) marks.steps.push_back(event);
      if (value.equal(begin)) marks.trial_begins.push_back(event);
      if (value.equal(end)) marks.trial_ends.push_back(event);
    }
    for (auto* events : {&marks.steps, &marks.trial_begins, &marks.trial_ends}) std::sort(events->begin(), events->end());
  }
  snapshot::TraceColumnsView view() const { return {span_of(action), span_of(addr), span_of(size), span_of(stream)}; }
  Column<std::uint8_t> action;
  Column<std::uint64_t> addr, size, stream;
  snapshot::StepMarks marks;  // stowage.mark_step()'s and fit's trials', each ascending
};

// The columns of one device's trace as the findings read them (its stacks' frames, device_free).
struct ColumnsArgument {
  explicit ColumnsArgument(const py::object& columns)
      : events(columns), stack(Column<std::int32_t>::ensure(columns.attr("stack"))) {
    if (!stack) throw py::error_already_set();
    const py::object missing = py::module_::import("builtins").attr("object")();
    for (const py::handle frames : columns.attr("stacks")) stacks.push_back(frames_of(frames, missing));
    input = {span_of(events.action), span_of(events.addr), span_of(events.size), span_of(stack), stacks,
             events.marks, {}};
    for (const auto [index, value] : columns.attr("device_free").cast<py::dict>()) {
      const py::int_ bytes(py::reinterpret_borrow<py::object>(value));
      input.device_free.emplace(index.cast<std::int64_t>(), wide_of(bytes));
    }
  }
  EventColumns events;
  Column<std::int32_t> stack;
  std::vector<std::vector<snapshot::Frame>> stacks;
  snapshot::TraceInput input;
};

// frame_site() of a block's frames, read up to its first user frame.
std::optional<std::string> block_site(const py::handle& stack, const py::object& missing) {
  const int given = PyObject_IsTrue(stack.ptr());
  if (given < 0) throw py::error_already_set();
  if (given == 0) return std::nullopt;
  std::optional<py::object> python;  // the innermost Python frame's get
  for (const py::handle frame : stack) {
    const py::object get = frame.attr("get");
    const snapshot::FrameKind kind = snapshot::frame_kind(utf8_of(get("filename", "")));
    if (kind == snapshot::FrameKind::kUser) return site_of_frame(get, missing);
    if (!python && kind == snapshot::FrameKind::kLibrary) python = get;
  }
  if (python) return site_of_frame(*python, missing);
  return std::nullopt;
}

// The segments' blocks, their sites named where the findings read them: live blocks', or every
// block's where the HTML report draws them (`every_site`).
std::vector<snapshot::SegmentInput> segments_of(const py::list& segments, bool every_site) {
  std::vector<snapshot::SegmentInput> out;
  const py::object missing = py::module_::import("builtins").attr("object")();
  for (const py::handle segment : segments) {
    const py::object get = segment.attr("get");
    snapshot::SegmentInput row{wide_of(py::int_(segment["address"])), wide_of(py::int_(segment["total_size"])),
                               PyObject_IsTrue(get("is_expandable").ptr()) == 1, {}};
    for (const py::handle block : get("blocks", py::list())) {
      const py::object field = block.attr("get");
      const Wide size = wide_of(py::int_(block["size"]));
      const bool requested = py::reinterpret_borrow<py::object>(block).contains("requested_size");
      std::string state = utf8_of(field("state", ""));
      std::optional<std::string> site;
      if (every_site || state.starts_with("active")) site = block_site(field("frames"), missing);
      row.blocks.push_back({size, requested ? wide_of(py::int_(block["requested_size"])) : size, std::move(state),
                            std::move(site)});
    }
    out.push_back(std::move(row));
  }
  return out;
}

// stowage's tags for device `device` (the snapshot's stowage_tags; None: none), read and checked by
// snapshot/tags_reader.hpp against the trace's `action` codes.
std::optional<snapshot::ExactTags> tags_of(const py::object& tags, std::int64_t device,
                                           std::span<const std::uint8_t> action) {
  PythonObjects objects;
  return snapshot::read_tags(objects, tags.ptr(), device, action);
}

// Rows of text cells as lists of str, each cell as the snapshot held it (a lone surrogate too).
py::list text_rows(const snapshot::TextRows& rows) {
  py::list out;
  for (const std::vector<std::string>& row : rows) {
    py::list cells;
    for (const std::string& cell : row) cells.append(utf8_str(cell));
    out.append(cells);
  }
  return out;
}

// A bound findings type: byte counts as Python ints, strings as the snapshot held them.
template <typename T>
class Bound {
 public:
  Bound(py::module_& module, const char* name, const char* doc) : class_(module, name, doc) {}
  Bound& bytes(const char* name, Wide T::*member) {
    class_.def_property_readonly(name, [member](const T& self) { return int_of(self.*member); });
    return *this;
  }
  Bound& text(const char* name, std::string T::*member) {
    class_.def_property_readonly(name, [member](const T& self) { return utf8_str(self.*member); });
    return *this;
  }
  template <typename Field>
  Bound& plain(const char* name, Field T::*member) {
    class_.def_readonly(name, member);
    return *this;
  }
  template <typename Method>
  Bound& method(const char* name, Method method) {
    class_.def(name, method);
    return *this;
  }
  template <typename Getter>
  Bound& computed(const char* name, Getter getter) {
    class_.def_property_readonly(name, getter);
    return *this;
  }

 private:
  py::class_<T> class_;
};

void bind_segment_findings(py::module_& module) {
  using namespace snapshot;
  Bound<Totals>(module, "Totals", "A device's memory at the snapshot (snapshot/segment_findings.hpp).")
      .bytes("allocated", &Totals::allocated).bytes("active", &Totals::active).bytes("requested", &Totals::requested)
      .bytes("reserved", &Totals::reserved).bytes("reserved_unallocated", &Totals::reserved_unallocated)
      .bytes("largest_free_block", &Totals::largest_free_block).plain("fragmentation", &Totals::fragmentation)
      .plain("segments", &Totals::segments);
  Bound<SizeBucket>(module, "SizeBucket", "Segments of one size bucket.")
      .text("size", &SizeBucket::size).plain("count", &SizeBucket::count).bytes("bytes", &SizeBucket::bytes);
  Bound<HeldSegment>(module, "HeldSegment", "A segment held by one small live block.")
      .bytes("address", &HeldSegment::address).bytes("segment_bytes", &HeldSegment::segment_bytes)
      .bytes("live_bytes", &HeldSegment::live_bytes).bytes("held_back", &HeldSegment::held_back)
      .text("site", &HeldSegment::site);
  Bound<SegmentSummary>(module, "SegmentSummary", "The segments: by size, how full, held by one small block.")
      .plain("count", &SegmentSummary::count).plain("by_size", &SegmentSummary::by_size)
      .plain("fill_quartiles", &SegmentSummary::fill_quartiles)
      .plain("held_by_one_small_block", &SegmentSummary::held_by_one_small_block);
  Bound<SiteLive>(module, "SiteLive", "Live bytes and allocations at one site.")
      .text("site", &SiteLive::site).bytes("bytes", &SiteLive::bytes).plain("allocations", &SiteLive::allocations);
}

void bind_trace_findings(py::module_& module) {
  using namespace snapshot;
  Bound<ModuleLive>(module, "ModuleLive", "Live bytes made by one module path.")
      .text("module", &ModuleLive::module).bytes("bytes", &ModuleLive::bytes);
  Bound<Peak>(module, "Peak", "A live-bytes peak and what was live there (snapshot/trace_findings.hpp).")
      .bytes("live_bytes", &Peak::live_bytes).plain("event_index", &Peak::event_index)
      .bytes("baseline", &Peak::baseline).plain("sites", &Peak::sites).plain("modules", &Peak::modules)
      .computed("categories", [](const Peak& self) {
        py::list rows;
        for (const auto& [name, bytes] : self.categories) rows.append(py::make_tuple(name, int_of(bytes)));
        return rows;
      });
  Bound<OomFinding>(module, "OomFinding", "An out-of-memory event and what was live then.")
      .plain("event_index", &OomFinding::event_index).bytes("requested", &OomFinding::requested)
      .bytes("device_free", &OomFinding::device_free).bytes("live_bytes", &OomFinding::live_bytes)
      .plain("sites", &OomFinding::sites).plain("in_fit_trial", &OomFinding::in_fit_trial)
      .plain("under_stowage", &OomFinding::under_stowage);
  Bound<Step>(module, "Step", "One step of the trace (snapshot/trace_steps.hpp).")
      .plain("number", &Step::number).plain("first_event", &Step::first_event).plain("last_event", &Step::last_event)
      .bytes("peak_bytes", &Step::peak_bytes).plain("peak_event", &Step::peak_event)
      .bytes("end_bytes", &Step::end_bytes).plain("fit_trial", &Step::fit_trial);
  Bound<GrowingSite>(module, "GrowingSite", "A site whose live bytes grew at every step's end.")
      .text("site", &GrowingSite::name).bytes("bytes_per_step", &GrowingSite::bytes_per_step)
      .plain("steps", &GrowingSite::steps);
  Bound<Advice>(module, "Advice", "One piece of advice (snapshot/advice.hpp).")
      .plain("rule", &Advice::rule).bytes("waste_bytes", &Advice::waste).bytes("saving_bytes", &Advice::saving)
      .plain("upper_bound", &Advice::upper_bound).text("advice", &Advice::text);
  Bound<Timeline>(module, "Timeline", "Live bytes by group, sampled (snapshot/timelines.hpp).")
      .plain("x", &Timeline::x).plain("peak_index", &Timeline::peak_index)
      .computed("series", [](const Timeline& self) {
        py::list rows;
        for (const auto& [name, values] : self.series) {
          py::list bytes;
          for (const Wide value : values) bytes.append(int_of(value));
          rows.append(py::make_tuple(utf8_str(name), bytes));
        }
        return rows;
      });
  Bound<Timelines>(module, "Timelines", "The HTML report's timelines: by site, by category, by module.")
      .plain("by_site", &Timelines::by_site).plain("by_category", &Timelines::by_category)
      .plain("by_module", &Timelines::by_module);
  Bound<LiveMoment>(module, "LiveMoment", "The allocations live just after an event, and what each is.")
      .plain("event_index", &LiveMoment::event_index).plain("events", &LiveMoment::events)
      .plain("categories", &LiveMoment::categories);
  Bound<Findings>(module, "Findings", "stowage inspect's findings about one device (snapshot/inspection.hpp).")
      .plain("totals", &Findings::totals).plain("segments", &Findings::segments)
      .plain("sites_at_end", &Findings::sites_at_end)
      .computed("peak", [](const Findings& self) { return self.trace.peak; })
      .computed("fit_trial_peak", [](const Findings& self) { return self.trace.fit_trial_peak; })
      .computed("ooms", [](const Findings& self) { return self.trace.ooms; })
      .computed("oom_events", [](const Findings& self) { return self.trace.oom_events; })
      .computed("steps", [](const Findings& self) { return self.trace.steps.steps; })
      .computed("steps_found_by", [](const Findings& self) { return self.trace.steps.found_by; })
      .computed("growing", [](const Findings& self) { return self.trace.growing; })
      .computed("advice", [](const Findings& self) { return self.trace.advice; })
      .computed("exact_categories", [](const Findings& self) { return self.trace.exact_categories; })
      .computed("timelines", [](const Findings& self) { return self.trace.timelines; })
      .computed("moments", [](const Findings& self) { return self.trace.moments; })
      .computed("block_sites", [](const Findings& self) {
        py::list segments;
        for (const auto& sites : self.block_sites) {
          py::list names;
          for (const std::string& site : sites) names.append(utf8_str(site));
          segments.append(names);
        }
        return segments;
      });
}

void bind_inspect(py::module_& module) {
  module.attr("advice_loss_chunks") = snapshot::kLossChunks;
  module.attr("timeline_max_points") = snapshot::kMaxPoints;
  py::tuple names(std::size(snapshot::kCategoryNames));
  for (std::size_t k = 0; k < std::size(snapshot::kCategoryNames); ++k) names[k] = snapshot::kCategoryNames[k];
  module.attr("category_names") = names;
  bind_segment_findings(module);
  bind_trace_findings(module);
  module.def(
      "block_of_paths",
      [](const std::vector<std::string>& paths) {
        snapshot::PathBlocks found = snapshot::block_of_paths(paths);
        return py::make_tuple(std::move(found.block_of_path), std::move(found.blocks));
      },
      py::arg("paths"), "The model's blocks among module paths, and each path's (snapshot/recompute_estimate.hpp).");
  module.def(
      "inspect",
      [](const py::object& columns, const py::list& segments, std::size_t top, bool under_stowage,
         const py::object& tags, std::int64_t device, bool timelines, std::vector<std::int64_t> moments) {
        const ColumnsArgument trace(columns);
        snapshot::InspectOptions options{top, under_stowage, tags_of(tags, device, trace.input.action), timelines,
                                         std::move(moments)};
        const std::vector<snapshot::SegmentInput> read = segments_of(segments, timelines);
        py::gil_scoped_release released;
        return snapshot::inspect(trace.input, read, std::move(options));
      },
      py::arg("columns"), py::arg("segments"), py::arg("top"), py::arg("under_stowage"), py::arg("tags"),
      py::arg("device"), py::arg("timelines") = false, py::arg("moments") = std::vector<std::int64_t>{},
      "stowage inspect's findings about one device: its trace's columns (TraceColumns), its segments "
      "(the snapshot's dicts), the sites listed (`top`), whether stowage's allocator recorded it, "
      "the snapshot's stowage_tags (None: none) and the device's number in them (SnapshotRefused naming a "
      "field that does not fit), whether to draw the HTML report's timelines, and the events after which to say "
      "what was live (`moments`: the categories benches check them by).");
}

void bind_device_events(py::module_& module) {
  module.def(
      "device_event_arrays",
      [](const py::object& trace) {
        const EventColumns columns(trace);
        const snapshot::TraceColumnsView view = columns.view();
        const std::span<const std::int64_t> marks = columns.marks.steps;
        const auto n = static_cast<py::ssize_t>(snapshot::count_device_events(view, marks));
        py::array_t<std::uint8_t> kinds(n);
        py::array_t<std::uint64_t> addrs(n), sizes(n), streams(n);
        const auto out = [n](auto& array) { return std::span(array.mutable_data(), static_cast<std::size_t>(n)); };
        snapshot::fill_device_events(view, marks, out(kinds), out(addrs), out(sizes), out(streams));
        return py::make_tuple(kinds, addrs, sizes, streams);
      },
      py::arg("trace"),
      "A device's alloc, free_completed and step-end events (TraceColumns) as stowage._core.ReplayEvents' arrays.");
  Bound<snapshot::NativeFigures>(module, "NativeFigures", "What the recording allocator did (snapshot/native_figures.hpp).")
      .computed("peak_reserved", [](const snapshot::NativeFigures& self) {
        return self.peak_reserved ? py::object(int_of(*self.peak_reserved)) : py::none();
      })
      .plain("preexisting_segments", &snapshot::NativeFigures::preexisting_segments)
      .bytes("preexisting_bytes", &snapshot::NativeFigures::preexisting_bytes)
      .plain("allocs_in_preexisting", &snapshot::NativeFigures::allocs_in_preexisting)
      .bytes("bytes_in_preexisting", &snapshot::NativeFigures::bytes_in_preexisting)
      .method("comparable", [](const snapshot::NativeFigures& self, const py::int_& peak_requested) {
        return self.comparable(wide_of(peak_requested));
      })
      .method("replay_fields", [](const snapshot::NativeFigures& self, const py::int_& peak_requested) {
        const py::object peak_reserved = self.peak_reserved ? py::object(int_of(*self.peak_reserved)) : py::none();
        return py::dict("native_peak_reserved"_a = peak_reserved, "preexisting_segments"_a = self.preexisting_segments,
                        "preexisting_segment_bytes"_a = int_of(self.preexisting_bytes),
                        "allocs_in_preexisting_segments"_a = self.allocs_in_preexisting,
                        "bytes_in_preexisting_segments"_a = int_of(self.bytes_in_preexisting),
                        "native_comparable"_a = self.comparable(wide_of(peak_requested)));
      });
  module.def(
      "native_figures",
      [](const py::object& trace, const py::list& segments, std::int64_t device) {
        const EventColumns columns(trace);
        std::vector<snapshot::SegmentExtent> extents;
        const py::int_ index(device);
        for (const py::handle segment : segments) {
          if (!segment.attr("get")("device", index).equal(index)) continue;
          extents.push_back({wide_of(py::int_(segment["address"])), wide_of(py::int_(segment["total_size"]))});
        }
        return snapshot::native_figures(span_of(columns.action), span_of(columns.addr), span_of(columns.size), extents);
      },
      py::arg("trace"), py::arg("segments"), py::arg("device"),
      "What the allocator that recorded device `device`'s trace (TraceColumns) did, its segments among "
      "`segments` (the snapshot's dicts).");
  module.def(
      "step_period",
      [](const Column<std::uint8_t>& kinds, const Bytes& sizes) -> py::object {
        const auto found = snapshot::step_period(span_of(kinds), span_of(sizes));
        return found ? py::object(py::int_(*found)) : py::none();
      },
      py::arg("kinds"), py::arg("sizes"), "The number of steps after which the steps repeat, or None.");
}

// torch.profiler's allocation events as a snapshot's trace (snapshot/profiler_order.hpp).
void bind_profiler_trace(py::module_& module) {
  module.def(
      "profiler_order",
      [](const std::vector<std::int64_t>& time_ns, const std::vector<std::int64_t>& size,
         const std::vector<std::int64_t>& total_after) { return snapshot::profiler_order(time_ns, size, total_after); },
      py::arg("time_ns"), py::arg("size"), py::arg("total_after"),
      "torch.profiler's allocation events' indexes in order (snapshot/profiler_order.hpp).");
  module.def(
      "profiled_trace",
      [](const std::vector<std::int64_t>& time_ns, const std::vector<std::uint64_t>& address,
         const std::vector<std::int64_t>& size, const std::vector<std::int64_t>& total_after,
         std::vector<std::int64_t> marks, const std::string& mark_metadata) {
        static constexpr const char* kActions[] = {"alloc", "free_requested", "free_completed", "snapshot"};
        py::list trace;
        for (const snapshot::ProfiledEvent& event : snapshot::profiled_trace(time_ns, address, size, total_after,
                                                                             std::move(marks))) {
          py::dict entry("action"_a = kActions[static_cast<int>(event.kind)], "addr"_a = event.address,
                         "size"_a = event.size, "stream"_a = 0, "time_us"_a = event.time_us);
          if (event.kind == snapshot::ProfiledEvent::Kind::kStepEnd) entry["user_metadata"] = mark_metadata;
          trace.append(std::move(entry));
        }
        return trace;
      },
      py::arg("time_ns"), py::arg("address"), py::arg("size"), py::arg("total_after"), py::arg("marks"),
      py::arg("mark_metadata"),
      "torch.profiler's allocation events (signed sizes) and the steps' ends as a snapshot's device trace of "
      "event dicts (snapshot/profiler_order.hpp); a step end is a 'snapshot' event with `mark_metadata`.");
}

// The rows inspect's terminal and HTML reports share (snapshot/findings_rows.hpp).
void bind_findings_rows(py::module_& module) {
  using namespace snapshot;
  module.def(
      "bytes_text", [](const py::object& value) { return bytes_text(wide_of(py::int_(value))); }, py::arg("value"),
      "int(value) bytes as format_bytes writes them, '-' before a negative count ('-1.50 MiB').");
  module.def(
      "site_rows", [](const std::vector<SiteLive>& sites, const py::int_& total) {
        return text_rows(site_rows(sites, wide_of(total)));
      },
      py::arg("sites"), py::arg("total"), "Sites (SiteLive) as rows: live, share of `total`, allocations, site.");
  module.def(
      "category_rows", [](const Peak& peak, bool before_trace) { return text_rows(category_rows(peak, before_trace)); },
      py::arg("peak"), py::arg("before_trace"),
      "A peak's categories as rows, largest first: live, share, category (and the bytes live before the trace).");
  module.def(
      "module_rows", [](const Peak& peak) { return text_rows(module_rows(peak)); }, py::arg("peak"),
      "A peak's modules as rows: live, share, module.");
  module.def(
      "held_rows", [](const std::vector<HeldSegment>& held) { return text_rows(held_rows(held)); }, py::arg("held"),
      "Segments held by one small block as rows: segment, live, held back, site.");
  module.def(
      "step_rows", [](const std::vector<Step>& steps) { return text_rows(step_rows(steps)); }, py::arg("steps"),
      "Steps as rows: step, events, peak, at its end.");
}

void bind_snapshot_diff(py::module_& module) {
  using namespace snapshot;
  Bound<SnapshotTotals>(module, "SnapshotTotals", "One snapshot's totals, as stowage diff compares them.")
      .bytes("allocated", &SnapshotTotals::allocated).bytes("reserved", &SnapshotTotals::reserved)
      .plain("segments", &SnapshotTotals::segments).bytes("largest_free_block", &SnapshotTotals::largest_free_block)
      .plain("fragmentation", &SnapshotTotals::fragmentation)
      .computed("trace_peak", [](const SnapshotTotals& self) {
        return self.trace_peak ? py::object(int_of(*self.trace_peak)) : py::none();
      });
  Bound<SiteChange>(module, "SiteChange", "A site's live bytes at the end, before and after.")
      .text("site", &SiteChange::site).bytes("before", &SiteChange::before).bytes("after", &SiteChange::after)
      .bytes("change", &SiteChange::change);
  Bound<SegmentChange>(module, "SegmentChange", "A segment in both snapshots whose size or live bytes changed.")
      .bytes("address", &SegmentChange::address).bytes("size_before", &SegmentChange::size_before)
      .bytes("size_after", &SegmentChange::size_after).bytes("live_before", &SegmentChange::live_before)
      .bytes("live_after", &SegmentChange::live_after).bytes("live_change", &SegmentChange::live_change);
  Bound<SegmentsDiff>(module, "SegmentsDiff", "Segments given back, new, and changed in place.")
      .plain("only_before", &SegmentsDiff::only_before).bytes("only_before_bytes", &SegmentsDiff::only_before_bytes)
      .plain("only_after", &SegmentsDiff::only_after).bytes("only_after_bytes", &SegmentsDiff::only_after_bytes)
      .plain("changed", &SegmentsDiff::changed).plain("changed_count", &SegmentsDiff::changed_count);
  Bound<SnapshotsDiff>(module, "SnapshotsDiff", "Two snapshots of one device compared (snapshot/snapshot_diff.hpp).")
      .plain("before", &SnapshotsDiff::before).plain("after", &SnapshotsDiff::after)
      .computed("sites_grew", [](const SnapshotsDiff& self) { return self.sites.grew; })
      .computed("sites_shrank", [](const SnapshotsDiff& self) { return self.sites.shrank; })
      .plain("segments", &SnapshotsDiff::segments);
  module.def(
      "diff",
      [](const py::object& before_trace, const py::list& before_segments, const py::object& after_trace,
         const py::list& after_segments, std::size_t top) {
        const ColumnsArgument a(before_trace), b(after_trace);
        const std::vector<SegmentInput> a_segments = segments_of(before_segments, false);
        const std::vector<SegmentInput> b_segments = segments_of(after_segments, false);
        py::gil_scoped_release released;
        return diff_snapshots({a.input, a_segments}, {b.input, b_segments}, top);
      },
      py::arg("before_trace"), py::arg("before_segments"), py::arg("after_trace"), py::arg("after_segments"),
      py::arg("top"),
      "Two snapshots of one device compared: each its trace's columns (TraceColumns) and its segments (the "
      "snapshot's dicts); the `top` sites that grew and shrank, and segments changed in place.");
  module.def(
      "diff_report",
      [](const SnapshotsDiff& diff) {
        const auto table_of = [](const TextTable& table) {
          return py::make_tuple(table.title, table.columns, table.left, text_rows(table.rows));
        };
        const DiffReport report = diff_report(diff);
        py::list sites;
        for (const TextTable& table : report.sites) sites.append(table_of(table));
        const py::object changed =
            report.changed_segments ? py::object(table_of(*report.changed_segments)) : py::none();
        return py::make_tuple(table_of(report.totals), sites, report.segments, changed);
      },
      py::arg("diff"),
      "stowage diff's report as the terminal shows it (snapshot/diff_report.hpp): (totals, the sites' tables, "
      "the line on segments, the changed segments' table or none), each table (title, columns, columns justified "
      "left, rows of text cells).");
}

}  // namespace

void bind_trace_analysis(py::module_& module) {
  bind_inspect(module);
  bind_snapshot_diff(module);
  bind_findings_rows(module);
  bind_device_events(module);
  bind_profiler_trace(module);
}

}  // namespace stowage::python
