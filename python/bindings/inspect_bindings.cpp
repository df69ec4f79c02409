// stowage._core.inspect: `stowage inspect`'s findings about one device (snapshot/inspection.hpp)
// from its trace's columns (stowage.snapshot_reader.TraceColumns) and its segments (the
// snapshot's dicts), as one bound object. Conversions only: fields are read as Python reads them
// (int(), str(), a missing key a KeyError), byte counts leave as Python ints, strings as the
// snapshot held them (lone surrogates too).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "python/bindings/bindings.hpp"
#include "python/bindings/python_values.hpp"
#include "snapshot/categories.hpp"
#include "snapshot/inspection.hpp"

namespace py = pybind11;

namespace stowage::python {

namespace {

using snapshot::Wide;
template <typename T>
using Column = py::array_t<T, py::array::c_style | py::array::forcecast>;

template <typename T>
std::span<const T> span_of(const Column<T>& values) {
  return {values.data(), static_cast<std::size_t>(values.size())};
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

// The columns of one device's trace, held for the call.
struct ColumnsArgument {
  explicit ColumnsArgument(const py::object& columns)
      : action(Column<std::uint8_t>::ensure(columns.attr("action"))),
        addr(Column<std::uint64_t>::ensure(columns.attr("addr"))),
        size(Column<std::uint64_t>::ensure(columns.attr("size"))),
        stack(Column<std::int32_t>::ensure(columns.attr("stack"))) {
    if (!action || !addr || !size || !stack) throw py::error_already_set();
    const py::object missing = py::module_::import("builtins").attr("object")();
    for (const py::handle frames : columns.attr("stacks")) stacks.push_back(frames_of(frames, missing));
    input = {span_of(action), span_of(addr), span_of(size), span_of(stack), stacks, {}, {}};
    input.marks.events = static_cast<std::int64_t>(action.size());
    const py::str step(snapshot::kMarkStep), begin(snapshot::kTrialBegin), end(snapshot::kTrialEnd);
    for (const auto [index, value] : columns.attr("user_metadata").cast<py::dict>()) {
      if (!py::isinstance<py::str>(value)) continue;
      const auto event = index.cast<std::int64_t>();
      if (value.equal(step)) input.marks.steps.push_back(event);
      if (value.equal(begin)) input.marks.trial_begins.push_back(event);
      if (value.equal(end)) input.marks.trial_ends.push_back(event);
    }
    for (auto* marks : {&input.marks.steps, &input.marks.trial_begins, &input.marks.trial_ends}) {
      std::sort(marks->begin(), marks->end());
    }
    for (const auto [index, value] : columns.attr("device_free").cast<py::dict>()) {
      input.device_free.emplace(index.cast<std::int64_t>(), wide_of(py::int_(py::reinterpret_borrow<py::object>(value))));
    }
  }
  Column<std::uint8_t> action;
  Column<std::uint64_t> addr, size;
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

// stowage.inspection.tags' tags: (events, category, module, paths, block_of_path, blocks).
snapshot::ExactTags tags_of(const py::tuple& tags) {
  snapshot::ExactTags out;
  out.events = tags[0].cast<std::vector<std::int64_t>>();
  out.category = tags[1].cast<std::vector<std::int8_t>>();
  out.module = tags[2].cast<std::vector<std::int64_t>>();
  for (const py::handle path : tags[3]) out.paths.push_back(utf8_of(path));
  out.block_of_path = tags[4].cast<std::vector<std::int64_t>>();
  for (const py::handle block : tags[5]) out.blocks.push_back(utf8_of(block));
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

}  // namespace

void bind_inspect(py::module_& module) {
  module.attr("advice_min_share") = snapshot::kMinShare;
  module.attr("advice_loss_chunks") = snapshot::kLossChunks;
  module.attr("timeline_max_points") = snapshot::kMaxPoints;
  py::tuple names(std::size(snapshot::kCategoryNames));
  for (std::size_t k = 0; k < std::size(snapshot::kCategoryNames); ++k) names[k] = snapshot::kCategoryNames[k];
  module.attr("category_names") = names;
  bind_segment_findings(module);
  bind_trace_findings(module);
  module.def(
      "inspect",
      [](const py::object& columns, const py::list& segments, std::size_t top, bool under_stowage,
         const py::object& tags, bool timelines, std::vector<std::int64_t> moments) {
        const ColumnsArgument trace(columns);
        snapshot::InspectOptions options{top, under_stowage, std::nullopt, timelines, std::move(moments)};
        if (!tags.is_none()) options.tags = tags_of(tags.cast<py::tuple>());
        const std::vector<snapshot::SegmentInput> read = segments_of(segments, timelines);
        py::gil_scoped_release released;
        return snapshot::inspect(trace.input, read, std::move(options));
      },
      py::arg("columns"), py::arg("segments"), py::arg("top"), py::arg("under_stowage"), py::arg("tags"),
      py::arg("timelines") = false, py::arg("moments") = std::vector<std::int64_t>{},
      "stowage inspect's findings about one device: its trace's columns (TraceColumns), its segments "
      "(the snapshot's dicts), the sites listed (`top`), whether stowage's allocator recorded it, "
      "stowage's tags (stowage.inspection.tags.read_tags', or None), whether to draw the HTML "
      "report's timelines, and the events after which to say what was live (`moments`).");
}

}  // namespace stowage::python
