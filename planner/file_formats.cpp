#include "planner/file_formats.hpp"

#include <algorithm>
#include <array>
#include <initializer_list>
#include <memory>
#include <unordered_map>
#include <utility>

#include "base/errors.hpp"

namespace stowage::planner {
namespace {


// The bounds a lifetime trace document sets for itself (its counts), by their index in Bound::ref.
enum BoundIndex : int { kLastOp, kLastTensor, kLastRegion, kPrefetchDepth, kBoundCount };
using TraceBounds = std::array<std::int64_t, kBoundCount>;

TraceBounds trace_bounds(std::size_t ops, std::size_t tensors, std::size_t regions) {
  const auto count = [](std::size_t n) { return static_cast<std::int64_t>(n); };
  return {count(ops) - 1, count(tensors) - 1, count(regions) - 1,
          std::max(kDefaultPrefetchDepth, count(tensors))};
}

template <typename SpecType, typename... Args>
SpecPtr make(Args&&... args) {
  return std::make_shared<const SpecType>(std::forward<Args>(args)...);
}

constexpr std::string_view kTotal = "2**56 bytes, 64 PiB: sums stay exact in 64 bits";
constexpr std::string_view kMostOps = "the most ops a trace has";

SpecPtr total_bytes(std::int64_t low = 0) {
  return make<IntSpec>(Bound::of(low), Bound::of(static_cast<std::int64_t>(kMaxTotalBytes)), std::string(kTotal));
}
SpecPtr text() { return make<TextSpec>(kMaxText); }
SpecPtr region_index() {
  return make<IntSpec>(Bound::of(-1), Bound::ref(kLastRegion, "the trace's last checkpoint region"));
}
SpecPtr tensor_index() { return make<IntSpec>(Bound::of(0), Bound::ref(kLastTensor, "the trace's last saved tensor")); }
SpecPtr calls() { return make<IntSpec>(Bound::of(0), Bound::of(kMaxCalls), "2**31"); }

// (module path, call (-1: none), save)
SpecPtr save() {
  return make<RowSpec>(std::vector<SpecPtr>{text(), make<IntSpec>(Bound::of(-1), Bound::of(kMaxCalls), "2**31"),
                                            make<IntSpec>(Bound::of(0), Bound::of(kMaxOps), std::string(kMostOps))});
}

SpecPtr op_spec() {
  const SpecPtr ms = make<NumberSpec>(Bound::of(0), Bound::of_real(kMaxMs), "a day: no step is longer");
  return make<RecordSpec>(
      RecordSpec::Fields{{"name", text()},
                         {"module", text()},
                         {"phase", make<ChoiceSpec>(std::vector<std::string>{"forward", "backward", "optimizer"})},
                         {"duration_ms", ms}},
      RecordSpec::Fields{{"other_bytes", total_bytes()},
                         {"region", region_index()},
                         {"region_op", make<IntSpec>(Bound::of(-1), Bound::of(kMaxOps), std::string(kMostOps))},
                         {"io_bytes", total_bytes()},
                         {"in_use_bytes", total_bytes(-static_cast<std::int64_t>(kMaxTotalBytes))}});
}

SpecPtr tensor_spec() {
  const SpecPtr op = make<IntSpec>(Bound::of(0), Bound::ref(kLastOp, "the trace's last op"));
  const SpecPtr ms = make<NumberSpec>(Bound::of(0), Bound::of_real(kMaxMs), "a day: no step is longer");
  return make<RecordSpec>(
      RecordSpec::Fields{{"module", text()},
                         {"bytes", make<IntSpec>(Bound::of(0), Bound::of(static_cast<std::int64_t>(kMaxBytes)),
                                                 "2**50 bytes, 1 PiB: beyond any device")},
                         {"created", op},
                         {"last_forward_use", op},
                         {"first_backward_use", op},
                         {"last_backward_use", op}},
      RecordSpec::Fields{{"recompute_ms", ms},
                         {"recomputable", make<BoolSpec>()},
                         {"offloadable", make<BoolSpec>()},
                         {"recompute_inputs", make<ListSpec>(tensor_index(), Bound::of(kMaxTensors))},
                         {"region", region_index()},
                         {"packs", make<ListSpec>(save(), Bound::of(kMaxOps))}});
}

SpecPtr region_spec() {
  return make<RecordSpec>(RecordSpec::Fields{{"module", text()},
                                             {"call", calls()},
                                             {"checkpointable", make<BoolSpec>()},
                                             {"ops", make<ListSpec>(text(), Bound::of(kMaxOps))},
                                             {"inputs", make<ListSpec>(tensor_index(), Bound::of(kMaxTensors))}});
}

const SpecPtr& cost_spec() {
  static const SpecPtr spec = [] {
    const std::string link = "1 MB/s to 1 PB/s, in bytes per ms";
    const auto bandwidth = [&] {
      return make<NumberSpec>(Bound::of_real(kMinBytesPerMs), Bound::of_real(kMaxBytesPerMs), link);
    };
    return make<RecordSpec>(RecordSpec::Fields{
        {"to_host_bytes_per_ms", bandwidth()},
        {"to_device_bytes_per_ms", bandwidth()},
        {"prefetch_depth",
         make<IntSpec>(Bound::of(0), Bound::ref(kPrefetchDepth, "the trace's saved tensors (one buffer each: no "
                                                                "deeper prefetch exists)"))}});
  }();
  return spec;
}

SpecPtr version() { return make<IntSpec>(Bound::of(kFormatVersion), Bound::of(kFormatVersion)); }
SpecPtr format(std::string_view name) { return make<ChoiceSpec>(std::vector<std::string>{std::string(name)}); }

const Spec& trace_spec() {
  static const SpecPtr spec = make<RecordSpec>(
      RecordSpec::Fields{{"format", format(kLifetimesFormat)},
                         {"version", version()},
                         {"ops", make<ListSpec>(op_spec(), Bound::of(kMaxOps))},
                         {"tensors", make<ListSpec>(tensor_spec(), Bound::of(kMaxTensors))},
                         {"regions", make<ListSpec>(region_spec(), Bound::of(kMaxRegions))},
                         {"cost", cost_spec()},
                         {"unconstrained_peak_bytes", total_bytes()}},
      RecordSpec::Fields{{"kept_saves", make<ListSpec>(save(), Bound::of(kMaxOps))}});
  return *spec;
}

// An object whose fields another check looks at.
class AnyObject final : public Spec {
 public:
  void walk(DocumentView& view, DocNode value, Bounds) const override {
    if (view.kind(value) != DocKind::kDict) throw wrong_kind(view, "an object", value);
  }
};

// {"batch": [2, 4], "seq": [128, 256, 384]}: kMaxSizes sizes, each kMinPoints to kMaxPoints
// distinct points of 1 to kMaxSizeValue.
class SizesSpec final : public Spec {
 public:
  void walk(DocumentView& view, DocNode value, Bounds bounds) const override;

 private:
  TextSpec name_{64};
  ListSpec points_{make<IntSpec>(Bound::of(1), Bound::of(kMaxSizeValue), "2**31"), Bound::of(kMaxPoints),
                   static_cast<std::size_t>(kMinPoints)};
};

// How a path names a field of an object: its name, or the key as the view names it.
PathPart key_part(DocumentView& view, DocNode key) {
  if (view.kind(key) == DocKind::kStr) {
    std::size_t characters = 0;
    return at_name(std::string(view.as_str(key, characters)));
  }
  PathPart part;
  part.text = view.path_text(key, part.index);
  return part;
}

void SizesSpec::walk(DocumentView& view, DocNode value, Bounds bounds) const {
  if (view.kind(value) != DocKind::kDict || view.length(value) == 0) {
    throw Refused{joined({"expected an object of 1 to ", std::to_string(kMaxSizes), " sizes, got ", view.shown(value)}),
                  {}};
  }
  if (view.length(value) > static_cast<std::size_t>(kMaxSizes)) {
    throw Refused{joined({grouped(static_cast<std::int64_t>(view.length(value))), " sizes is above ",
                          std::to_string(kMaxSizes)}),
                  {}};
  }
  std::size_t cursor = 0;
  DocNode key = nullptr;
  DocNode points = nullptr;
  while (view.next_field(value, cursor, key, points)) {
    try {
      name_.walk(view, key, bounds);
      points_.walk(view, points, bounds);
      std::vector<std::int64_t> seen;
      std::string listed = "[";
      for (std::size_t i = 0; i < view.length(points); ++i) {
        std::int64_t point = 0;
        bool negative = false;
        view.as_int(view.item(points, i), point, negative);
        seen.push_back(point);
        listed.append(i == 0 ? "" : ", ").append(std::to_string(point));
      }
      std::sort(seen.begin(), seen.end());
      if (std::adjacent_find(seen.begin(), seen.end()) != seen.end()) {
        throw Refused{joined({listed, "] repeats a point"}), {}};
      }
    } catch (Refused& refused) {
      refused.path.push_back(key_part(view, key));
      throw;
    }
  }
}

// The format and version first, so that another file is named as such.
std::optional<Refusal> check_header(DocumentView& view, DocNode document, std::string_view form,
                                    std::string_view kind) {
  const DocNode found = view.kind(document) == DocKind::kDict ? view.field(document, "format") : nullptr;
  if (found == nullptr || !view.equals(found, form)) {
    if (found != nullptr && view.kind(found) != DocKind::kNull) {
      return Refusal{"format", joined({"not ", kind, " (format ", view.shown(found), ", not '", form, "')"})};
    }
    return Refusal{"", joined({"not ", kind, " (no format '", form, "')"})};
  }
  // Compared as the language compares: 1.0 and true pass here, and the schema names their type.
  const DocNode version = view.field(document, "version");
  if (version == nullptr || !view.equals(version, kFormatVersion)) {
    return Refusal{"version", joined({kind, " version ", version != nullptr ? view.shown(version) : "null",
                                      "; this stowage reads version ", std::to_string(kFormatVersion)})};
  }
  return std::nullopt;
}

// The document is an object whose ops, tensors and regions are lists: what its bounds are counted
// from.
std::optional<Refusal> check_lists(DocumentView& view, DocNode document, const std::string& field) {
  if (view.kind(document) != DocKind::kDict) {
    return refuse(field, {}, joined({"expected an object, got ", view.shown(document)}));
  }
  for (const char* name : {"ops", "tensors", "regions"}) {
    const DocNode list = view.field(document, name);
    if (list == nullptr) return refuse(field, {}, joined({"missing field '", name, "'"}));
    if (view.kind(list) != DocKind::kList) {
      return refuse(field, {at_name(name)}, joined({"expected a list, got ", view.shown(list)}));
    }
  }
  return std::nullopt;
}

std::int64_t integer_field(DocumentView& view, DocNode record, std::string_view name, std::int64_t otherwise) {
  const DocNode node = view.field(record, name);
  if (node == nullptr) return otherwise;
  std::int64_t value = 0;
  bool negative = false;
  view.as_int(node, value, negative);
  return value;
}

double real_field(DocumentView& view, DocNode record, std::string_view name) {
  const DocNode node = view.field(record, name);
  if (node == nullptr) return 0;
  if (view.kind(node) == DocKind::kFloat) return view.as_float(node);
  return static_cast<double>(integer_field(view, record, name, 0));
}

bool bool_field(DocumentView& view, DocNode record, std::string_view name, bool otherwise) {
  const DocNode node = view.field(record, name);
  return node == nullptr ? otherwise : view.as_bool(node);
}

std::string text_field(DocumentView& view, DocNode record, std::string_view name) {
  std::size_t characters = 0;
  return std::string(view.as_str(view.field(record, name), characters));
}

std::int64_t integer_at(DocumentView& view, DocNode list, std::size_t index) {
  std::int64_t value = 0;
  bool negative = false;
  view.as_int(view.item(list, index), value, negative);
  return value;
}

std::vector<std::size_t> indices_field(DocumentView& view, DocNode record, std::string_view name) {
  std::vector<std::size_t> indices;
  if (const DocNode list = view.field(record, name); list != nullptr) {
    for (std::size_t i = 0; i < view.length(list); ++i) {
      indices.push_back(static_cast<std::size_t>(integer_at(view, list, i)));
    }
  }
  return indices;
}

// A list of save sites ([module, call, save], schema-checked), absent as none.
std::vector<SaveSite> sites_field(DocumentView& view, DocNode record, std::string_view name) {
  std::vector<SaveSite> sites;
  if (const DocNode list = view.field(record, name); list != nullptr) {
    for (std::size_t i = 0; i < view.length(list); ++i) {
      const DocNode site = view.item(list, i);
      std::size_t characters = 0;
      sites.emplace_back(std::string(view.as_str(view.item(site, 0), characters)), integer_at(view, site, 1),
                         integer_at(view, site, 2));
    }
  }
  return sites;
}

}  // namespace

namespace {

// The ops as the trace holds them, and the rule across fields they keep: an op of a region is one
// of its ops (region_op), an op of none has none.
std::optional<Refusal> read_ops(DocumentView& view, DocNode document, const std::string& field, LifetimeTrace& trace) {
  const DocNode ops = view.field(document, "ops");
  const DocNode regions = view.field(document, "regions");
  const std::size_t count = view.length(ops);
  trace.ops.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    const DocNode op = view.item(ops, i);
    const std::int64_t region = integer_field(view, op, "region", kNoRegion);
    const std::int64_t region_op = integer_field(view, op, "region_op", -1);
    std::int64_t last = -1;  // the region's last op
    if (region >= 0) {
      const DocNode of_region = view.field(view.item(regions, static_cast<std::size_t>(region)), "ops");
      last = static_cast<std::int64_t>(view.length(of_region)) - 1;
    }
    if ((region < 0 && region_op != -1) || (region >= 0 && !(0 <= region_op && region_op <= last))) {
      std::string problem = joined({std::to_string(region_op), " is not an op of region ", std::to_string(region)});
      if (region >= 0) problem.append(" (0 to ").append(std::to_string(last)).append(")");
      return refuse(field, {at_name("ops"), at_index(i), at_name("region_op")}, std::move(problem));
    }
    TraceOp& made = trace.ops[i];
    made.name = text_field(view, op, "name");
    made.module = text_field(view, op, "module");
    const std::string phase = text_field(view, op, "phase");
    made.phase = phase == "forward" ? Phase::kForward : phase == "backward" ? Phase::kBackward : Phase::kOptimizer;
    made.duration_ms = real_field(view, op, "duration_ms");
    made.other_bytes = static_cast<std::uint64_t>(integer_field(view, op, "other_bytes", 0));
    made.region = static_cast<std::int32_t>(region);
    made.in_use_bytes = integer_field(view, op, "in_use_bytes", 0);
    made.io_bytes = static_cast<std::uint64_t>(integer_field(view, op, "io_bytes", 0));
    made.region_op = static_cast<std::int32_t>(region_op);
  }
  return std::nullopt;
}

SavedTensor read_tensor(DocumentView& view, DocNode tensor) {
  const auto index = [&](std::string_view name) { return static_cast<std::size_t>(integer_field(view, tensor, name, 0)); };
  SavedTensor made;
  made.module = text_field(view, tensor, "module");
  made.bytes = static_cast<std::uint64_t>(integer_field(view, tensor, "bytes", 0));
  made.created = index("created");
  made.last_forward_use = index("last_forward_use");
  made.first_backward_use = index("first_backward_use");
  made.last_backward_use = index("last_backward_use");
  made.recompute_ms = real_field(view, tensor, "recompute_ms");
  made.recomputable = bool_field(view, tensor, "recomputable", false);
  made.offloadable = bool_field(view, tensor, "offloadable", true);
  made.region = static_cast<std::int32_t>(integer_field(view, tensor, "region", kNoRegion));
  made.recompute_inputs = indices_field(view, tensor, "recompute_inputs");
  made.packs = sites_field(view, tensor, "packs");
  return made;
}

// The saved tensors as the trace holds them, and the rules across fields they keep: their bytes
// in all within kMaxTotalBytes, and only a tensor of a region recomputable.
std::optional<Refusal> read_tensors(DocumentView& view, DocNode document, const std::string& field,
                                    LifetimeTrace& trace) {
  const DocNode tensors = view.field(document, "tensors");
  const std::size_t count = view.length(tensors);
  trace.tensors.reserve(count);
  WideCount total = 0;
  for (std::size_t t = 0; t < count; ++t) {
    trace.tensors.push_back(read_tensor(view, view.item(tensors, t)));
    total += trace.tensors.back().bytes;
  }
  if (total > kMaxTotalBytes) {
    return refuse(field, {at_name("tensors")}, joined({grouped(total), " saved bytes in all is above ",
                                                       grouped(static_cast<WideCount>(kMaxTotalBytes))}));
  }
  for (std::size_t t = 0; t < count; ++t) {
    if (trace.tensors[t].recomputable && trace.tensors[t].region < 0) {
      return refuse(field, {at_name("tensors"), at_index(t), at_name("recomputable")},
                    "true for a tensor of no checkpoint region (region -1): stowage recomputes only regions");
    }
  }
  return std::nullopt;
}

ReadDocument refused(Refusal refusal) { return ReadDocument{{}, {}, std::move(refusal)}; }

// The regions, kept saves, cost model and unconstrained peak (schema-checked).
void read_rest(DocumentView& view, DocNode document, LifetimeTrace& trace) {
  const DocNode regions = view.field(document, "regions");
  for (std::size_t r = 0; r < view.length(regions); ++r) {
    const DocNode region = view.item(regions, r);
    TraceRegion& made = trace.regions.emplace_back();
    made.module = text_field(view, region, "module");
    made.call = integer_field(view, region, "call", 0);
    made.checkpointable = bool_field(view, region, "checkpointable", false);
    const DocNode ops = view.field(region, "ops");
    for (std::size_t i = 0; i < view.length(ops); ++i) {
      std::size_t characters = 0;
      made.ops.emplace_back(view.as_str(view.item(ops, i), characters));
    }
    made.inputs = indices_field(view, region, "inputs");
  }
  trace.kept_saves = sites_field(view, document, "kept_saves");
  const DocNode cost = view.field(document, "cost");
  trace.cost.to_host_bytes_per_ms = real_field(view, cost, "to_host_bytes_per_ms");
  trace.cost.to_device_bytes_per_ms = real_field(view, cost, "to_device_bytes_per_ms");
  trace.cost.prefetch_depth = static_cast<std::size_t>(integer_field(view, cost, "prefetch_depth", 0));
  trace.unconstrained_peak_bytes =
      static_cast<std::uint64_t>(integer_field(view, document, "unconstrained_peak_bytes", 0));
}

}  // namespace

ReadDocument read_lifetimes(DocumentView& view, DocNode document, const std::string& field) {
  if (field.empty()) {
    if (auto refusal = check_header(view, document, kLifetimesFormat, "a stowage lifetime trace")) {
      return refused(std::move(*refusal));
    }
  }
  if (auto refusal = check_lists(view, document, field)) return refused(std::move(*refusal));
  const TraceBounds bounds = trace_bounds(view.length(view.field(document, "ops")),
                                              view.length(view.field(document, "tensors")),
                                              view.length(view.field(document, "regions")));
  if (auto refusal = check(view, document, trace_spec(), bounds, field)) return refused(std::move(*refusal));
  LifetimeTrace trace;
  if (auto refusal = read_ops(view, document, field, trace)) return refused(std::move(*refusal));
  if (auto refusal = read_tensors(view, document, field, trace)) return refused(std::move(*refusal));
  read_rest(view, document, trace);
  try {
    trace.validate();
  } catch (const LogicError& error) {  // the trace's rules, naming the tensor and its values
    return refused(Refusal{field, error.message()});
  }
  ReadDocument read;
  read.traces.push_back(std::move(trace));
  return read;
}

std::optional<Refusal> check_cost(DocumentView& view, DocNode cost, std::size_t tensors) {
  const TraceBounds bounds = trace_bounds(0, tensors, 0);
  return check(view, cost, *cost_spec(), bounds, "cost");
}

ReadDocument read_sized(DocumentView& view, DocNode document) {
  if (auto refusal = check_header(view, document, kSizedFormat, "a stowage sized lifetime trace")) {
    return refused(std::move(*refusal));
  }
  static const SpecPtr spec = make<RecordSpec>(
      RecordSpec::Fields{{"format", format(kSizedFormat)},
                         {"version", version()},
                         {"sizes", make<SizesSpec>()},
                         {"profiles", make<ListSpec>(make<AnyObject>(), Bound::of(kMaxGridPoints))}});
  if (auto refusal = check(view, document, *spec)) return refused(std::move(*refusal));
  const DocNode sizes = view.field(document, "sizes");
  std::size_t cursor = 0;
  DocNode name = nullptr;
  DocNode points = nullptr;
  std::int64_t grid = 1;
  while (view.next_field(sizes, cursor, name, points)) grid *= static_cast<std::int64_t>(view.length(points));
  if (grid > kMaxGridPoints) {
    return refused(refuse("", {at_name("sizes")}, joined({"a grid of ", grouped(grid), " points is above ",
                                                          std::to_string(kMaxGridPoints)})));
  }
  const DocNode profiles = view.field(document, "profiles");
  const std::size_t count = view.length(profiles);
  if (static_cast<std::size_t>(grid) != count) {
    return refused(refuse("", {at_name("profiles")}, joined({std::to_string(count), " profiles for a grid of ",
                                                             std::to_string(grid), " points"})));
  }
  ReadDocument read;
  for (std::size_t i = 0; i < count; ++i) {
    ReadDocument one = read_lifetimes(view, view.item(profiles, i), joined({"profiles[", std::to_string(i), "]"}));
    if (one.refusal) return one;
    read.traces.push_back(std::move(one.traces.front()));
  }
  return read;
}

std::optional<std::string> decision_problem(Decision decision, bool recomputable, bool offloadable,
                                            std::int32_t region) {
  if (decision == Decision::kRecompute && (!recomputable || region < 0)) {
    return "'recompute' for a tensor that cannot be recomputed (not recomputable, or in no checkpoint region)";
  }
  if (decision == Decision::kOffload && !offloadable) return "'offload' for a tensor that cannot be offloaded";
  return std::nullopt;
}

std::optional<std::string> plan_problem(const LifetimeTrace& trace, const Plan& decisions) {
  if (decisions.size() != trace.tensors.size()) {
    return joined({"a plan needs one decision per saved tensor: ", std::to_string(decisions.size()), " for ",
                   std::to_string(trace.tensors.size())});
  }
  for (std::size_t t = 0; t < decisions.size(); ++t) {
    const SavedTensor& tensor = trace.tensors[t];
    std::optional<std::string> problem =
        decision_problem(decisions[t], tensor.recomputable, tensor.offloadable, tensor.region);
    if (!problem && static_cast<std::size_t>(tensor.region + 1) > trace.regions.size()) {
      problem = joined({"region ", std::to_string(tensor.region), " is not one of the trace's ",
                        std::to_string(trace.regions.size()), " regions"});
    }
    if (problem) return joined({"stowage.plan: saved tensor ", std::to_string(t), " (", tensor.module, "): ", *problem});
  }
  return std::nullopt;
}

namespace {

// One decision per saved tensor, each one the runtime can apply to its tensor, and no region both
// recomputing and offloading; read into `read`.
std::optional<Refusal> check_decisions(DocumentView& view, DocNode decisions, const LifetimeTrace& trace,
                                       Plan& read) {
  const std::size_t count = view.length(decisions);
  if (count != trace.tensors.size()) {
    return refuse("", {at_name("decisions")},
                  joined({grouped(static_cast<std::int64_t>(count)), " decisions for ",
                          grouped(static_cast<std::int64_t>(trace.tensors.size())), " saved tensors"}));
  }
  std::unordered_map<std::int32_t, std::size_t> recomputed;  // region -> its first such tensor
  std::unordered_map<std::int32_t, std::size_t> offloaded;
  for (std::size_t t = 0; t < count; ++t) {
    std::size_t characters = 0;
    const std::string_view name = view.as_str(view.item(decisions, t), characters);
    const Decision decision = decision_named(name).value_or(Decision::kKeep);  // (the schema's choices)
    read.push_back(decision);
    const SavedTensor& tensor = trace.tensors[t];
    std::optional<std::string> problem =
        decision_problem(decision, tensor.recomputable, tensor.offloadable, tensor.region);
    if (!problem && tensor.region >= 0 && decision != Decision::kKeep) {
      const bool recompute = decision == Decision::kRecompute;
      (recompute ? recomputed : offloaded).try_emplace(tensor.region, t);
      const auto& other = recompute ? offloaded : recomputed;
      if (const auto found = other.find(tensor.region); found != other.end()) {
        problem = joined({"'", name, "' in region ", std::to_string(tensor.region), ", where saved tensor ",
                          std::to_string(found->second), " is ", recompute ? "offloaded" : "recomputed",
                          ": a region recomputes or offloads, never both (a checkpoint keeps what it saves out "
                          "of the offloader's reach)"});
      }
    }
    if (problem) return refuse("", {at_name("decisions"), at_index(t)}, std::move(*problem));
  }
  return std::nullopt;
}

}  // namespace

ReadDocument read_plan(DocumentView& view, DocNode document) {
  if (auto refusal = check_header(view, document, kPlanFormat, "a stowage plan")) return refused(std::move(*refusal));
  static const SpecPtr spec = make<RecordSpec>(RecordSpec::Fields{
      {"format", format(kPlanFormat)},
      {"version", version()},
      {"budget", total_bytes(1)},
      {"decisions",
       make<ListSpec>(make<ChoiceSpec>(std::vector<std::string>{"keep", "offload", "recompute"}), Bound::of(kMaxTensors))},
      {"profile", make<AnyObject>()}});
  if (auto refusal = check(view, document, *spec)) return refused(std::move(*refusal));
  ReadDocument read = read_lifetimes(view, view.field(document, "profile"), "profile");
  if (read.refusal) return read;
  if (auto refusal = check_decisions(view, view.field(document, "decisions"), read.traces.front(), read.decisions)) {
    return refused(std::move(*refusal));
  }
  return read;
}

}  // namespace stowage::planner
