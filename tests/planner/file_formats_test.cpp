// The planner's files (planner/file_formats.hpp): a lifetime trace, a sized one and a plan read
// into traces, and each kind of refusal word for word: the format, the schema's bounds, the bounds
// a trace sets for itself, the rules across fields, the trace's own rules, the grid, the decisions.
#include "planner/file_formats.hpp"

#include <gtest/gtest.h>

#include <string>

#include "tests/planner/json_document.hpp"

namespace stowage::planner {
namespace {

using testing::JsonDocument;

// Two forward ops of region 0, two backward ops; tensor 0 made by op 0 (needed by op 3), tensor 1
// by op 1 (needed by op 2), both of region 0; a third, of no region, kept.
constexpr std::string_view kTrace = R"({"format": "stowage-lifetimes", "version": 1,
  "ops": [
    {"name": "aten.addmm.default", "module": "b.fc0", "phase": "forward", "duration_ms": 0.5, "other_bytes": 4096,
     "region": 0, "region_op": 0, "io_bytes": 300, "in_use_bytes": 100},
    {"name": "aten.addmm.default", "module": "b.fc1", "phase": "forward", "duration_ms": 1, "region": 0,
     "region_op": 1, "in_use_bytes": -200},
    {"name": "aten.mm.default", "module": "", "phase": "backward", "duration_ms": 0.75},
    {"name": "aten.mm.default", "module": "", "phase": "optimizer", "duration_ms": 0.25}],
  "tensors": [
    {"module": "b.fc0", "bytes": 100, "created": 0, "last_forward_use": 0, "first_backward_use": 3,
     "last_backward_use": 3, "recompute_ms": 0.5, "recomputable": true, "recompute_inputs": [], "region": 0,
     "packs": [["b.fc0", 0, 0]]},
    {"module": "b.fc1", "bytes": 50, "created": 1, "last_forward_use": 1, "first_backward_use": 2,
     "last_backward_use": 2, "recomputable": true, "offloadable": false, "recompute_inputs": [0], "region": 0},
    {"module": "input", "bytes": 8, "created": 0, "last_forward_use": 1, "first_backward_use": 2,
     "last_backward_use": 3}],
  "regions": [{"module": "b", "call": 0, "checkpointable": true, "ops": ["aten.addmm.default", "aten.addmm.default"],
               "inputs": []}],
  "cost": {"to_host_bytes_per_ms": 8e6, "to_device_bytes_per_ms": 8000000, "prefetch_depth": 2},
  "unconstrained_peak_bytes": 262144, "kept_saves": [["tokens", 0, 0]]})";

std::string replaced(std::string_view text, std::string_view from, std::string_view to) {
  std::string out(text);
  const std::size_t at = out.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) out.replace(at, from.size(), to);
  return out;
}

// "field: problem" of a refusal, or "read".
std::string verdict(const ReadDocument& read) {
  if (!read.refusal) return "read";
  return read.refusal->field.empty() ? read.refusal->problem : read.refusal->field + ": " + read.refusal->problem;
}

std::string trace_verdict(std::string_view text) {
  JsonDocument document(text);
  return verdict(read_lifetimes(document, document.root()));
}

TEST(FileFormatsTest, ALifetimeTraceDocumentIsReadIntoItsTrace) {
  JsonDocument document(kTrace);
  const ReadDocument read = read_lifetimes(document, document.root());
  ASSERT_EQ(verdict(read), "read");
  ASSERT_EQ(read.traces.size(), 1u);
  const LifetimeTrace& trace = read.traces.front();
  ASSERT_EQ(trace.ops.size(), 4u);
  EXPECT_EQ(trace.ops[0].module, "b.fc0");
  EXPECT_EQ(trace.ops[0].other_bytes, 4096u);
  EXPECT_EQ(trace.ops[0].io_bytes, 300u);
  EXPECT_EQ(trace.ops[1].duration_ms, 1.0);  // an integer where a number belongs
  EXPECT_EQ(trace.ops[1].in_use_bytes, -200);
  EXPECT_EQ(trace.ops[2].phase, Phase::kBackward);
  EXPECT_EQ(trace.ops[2].region, kNoRegion);
  EXPECT_EQ(trace.ops[3].phase, Phase::kOptimizer);
  ASSERT_EQ(trace.tensors.size(), 3u);
  EXPECT_EQ(trace.tensors[1].bytes, 50u);
  EXPECT_EQ(trace.tensors[1].first_backward_use, 2u);
  EXPECT_FALSE(trace.tensors[1].offloadable);
  EXPECT_EQ(trace.tensors[1].recompute_inputs, std::vector<std::size_t>{0});
  EXPECT_EQ(trace.tensors[0].recompute_ms, 0.5);
  // The file's defaults: not recomputable, offloadable, of no region.
  EXPECT_FALSE(trace.tensors[2].recomputable);
  EXPECT_TRUE(trace.tensors[2].offloadable);
  EXPECT_EQ(trace.tensors[2].region, kNoRegion);
  // What the runtime finds tensors by, and what the file holds beside them.
  EXPECT_EQ(trace.ops[1].region_op, 1);
  EXPECT_EQ(trace.ops[2].region_op, -1);
  EXPECT_EQ(trace.tensors[0].packs, (std::vector<SaveSite>{{"b.fc0", 0, 0}}));
  EXPECT_TRUE(trace.tensors[1].packs.empty());
  ASSERT_EQ(trace.regions.size(), 1u);
  EXPECT_EQ(trace.regions[0].module, "b");
  EXPECT_TRUE(trace.regions[0].checkpointable);
  EXPECT_EQ(trace.regions[0].ops, (std::vector<std::string>{"aten.addmm.default", "aten.addmm.default"}));
  EXPECT_EQ(trace.kept_saves, (std::vector<SaveSite>{{"tokens", 0, 0}}));
  EXPECT_EQ(trace.cost.to_device_bytes_per_ms, 8e6);
  EXPECT_EQ(trace.cost.prefetch_depth, 2u);
  EXPECT_EQ(trace.unconstrained_peak_bytes, 262144u);
}

TEST(FileFormatsTest, AnotherFileIsNamedByItsFormatAndVersion) {
  EXPECT_EQ(trace_verdict(R"({"format": "stowage-plan"})"),
            "format: not a stowage lifetime trace (format 'stowage-plan', not 'stowage-lifetimes')");
  EXPECT_EQ(trace_verdict("[1, 2]"), "not a stowage lifetime trace (no format 'stowage-lifetimes')");
  EXPECT_EQ(trace_verdict(R"({"format": null})"), "not a stowage lifetime trace (no format 'stowage-lifetimes')");
  EXPECT_EQ(trace_verdict(replaced(kTrace, R"("version": 1)", R"("version": 2)")),
            "version: a stowage lifetime trace version 2; this stowage reads version 1");
  // 1.0 == 1 passes the header, as in Python; the schema names its type.
  EXPECT_EQ(trace_verdict(replaced(kTrace, R"("version": 1)", R"("version": 1.0)")),
            "version: expected an integer, got a number (1.0)");
  EXPECT_EQ(trace_verdict(replaced(kTrace, R"("version": 1)", R"("version": true)")),
            "version: expected an integer, got a boolean (true)");
}

TEST(FileFormatsTest, TheSchemaAndTheBoundsTheTraceSetsAreChecked) {
  EXPECT_EQ(trace_verdict(replaced(kTrace, R"("prefetch_depth": 2)", R"("prefetch_depth": 100000)")),
            "cost.prefetch_depth: 100000 is above 3, the trace's saved tensors (one buffer each: no deeper prefetch "
            "exists)");
  EXPECT_EQ(trace_verdict(replaced(kTrace, R"("bytes": 100)", R"("bytes": 4611686018427387904)")),
            "tensors[0].bytes: 4611686018427387904 is above 1125899906842624 (2**50 bytes, 1 PiB: beyond any "
            "device)");
  EXPECT_EQ(trace_verdict(replaced(kTrace, R"("region": 0, "region_op": 0)", R"("region": 7, "region_op": 0)")),
            "ops[0].region: 7 is above 0, the trace's last checkpoint region");
  EXPECT_EQ(trace_verdict(replaced(kTrace, R"("created": 1,)", R"("created": 4,)")),
            "tensors[1].created: 4 is above 3, the trace's last op");
  EXPECT_EQ(trace_verdict(replaced(kTrace, R"("recompute_inputs": [0])", R"("recompute_inputs": [3])")),
            "tensors[1].recompute_inputs[0]: 3 is above 2, the trace's last saved tensor");
  EXPECT_EQ(trace_verdict(replaced(kTrace, R"("duration_ms": 0.75)", R"("duration_ms": NaN)")),
            "ops[2].duration_ms: nan is not a finite number");
  EXPECT_EQ(trace_verdict(replaced(kTrace, R"("phase": "optimizer")", R"("phase": "sideways")")),
            "ops[3].phase: 'sideways' is not one of 'forward', 'backward', 'optimizer'");
  EXPECT_EQ(trace_verdict(replaced(kTrace, R"(["b.fc0", 0, 0])", R"(["b.fc0", 0])")),
            "tensors[0].packs[0]: expected a list of 3 items, got a list of 2 items");
  EXPECT_EQ(trace_verdict(replaced(kTrace, R"("cost": {"to_host_bytes_per_ms": 8e6,)", R"("cost": {)")),
            "cost: missing field 'to_host_bytes_per_ms'");
  EXPECT_EQ(trace_verdict(replaced(kTrace, R"("module": "b", "call": 0)", R"("module": "b", "call": 0, "x": 1)")),
            "regions[0]: unknown field 'x' (fields: module, call, checkpointable, ops, inputs)");
  EXPECT_EQ(trace_verdict(replaced(kTrace, R"("tensors": [)", R"("tensors": 3, "t": [)")),
            "tensors: expected a list, got 3");
}

TEST(FileFormatsTest, TheRulesAcrossFieldsAreChecked) {
  EXPECT_EQ(trace_verdict(replaced(kTrace, R"("region_op": 1,)", R"("region_op": 2,)")),
            "ops[1].region_op: 2 is not an op of region 0 (0 to 1)");
  EXPECT_EQ(trace_verdict(replaced(kTrace, R"("duration_ms": 0.75})", R"("duration_ms": 0.75, "region_op": 0})")),
            "ops[2].region_op: 0 is not an op of region -1");
  const std::string big = replaced(replaced(replaced(kTrace, R"("bytes": 100)", R"("bytes": 1125899906842624)"),
                                            R"("bytes": 50)", R"("bytes": 1125899906842624)"),
                                   R"("bytes": 8)", R"("bytes": 1125899906842624)");
  EXPECT_EQ(trace_verdict(big), "read");  // 3 PiB in all: within 64
  EXPECT_EQ(trace_verdict(replaced(kTrace, R"("module": "input", "bytes": 8)",
                                     R"("module": "input", "recomputable": true, "bytes": 8)")),
            "tensors[2].recomputable: true for a tensor of no checkpoint region (region -1): stowage recomputes only "
            "regions");
}

TEST(FileFormatsTest, TheTracesOwnRulesAreCheckedLast) {
  EXPECT_EQ(trace_verdict(replaced(kTrace, R"("first_backward_use": 3,)", R"("first_backward_use": 0,)")),
            "saved tensor 0 (b.fc0) must be created <= last forward use < first backward use <= last backward use < "
            "4 ops, not 0, 0, 0, 3");
}

TEST(FileFormatsTest, ACostModelIsCheckedAgainstTheTracesTensors) {
  JsonDocument document(R"({"to_host_bytes_per_ms": 1e-9, "to_device_bytes_per_ms": 1, "prefetch_depth": 0})");
  const auto refusal = check_cost(document, document.root(), 40);
  ASSERT_TRUE(refusal.has_value());
  EXPECT_EQ(refusal->field, "cost.to_host_bytes_per_ms");
  EXPECT_EQ(refusal->problem, "1e-09 is below 1000.0");
  JsonDocument deep(R"({"to_host_bytes_per_ms": 1e6, "to_device_bytes_per_ms": 1e6, "prefetch_depth": 41})");
  EXPECT_EQ(check_cost(deep, deep.root(), 40)->problem,
            "41 is above 40, the trace's saved tensors (one buffer each: no deeper prefetch exists)");
  EXPECT_FALSE(check_cost(deep, deep.root(), 41).has_value());
  JsonDocument two(R"({"to_host_bytes_per_ms": 1e6, "to_device_bytes_per_ms": 1e6, "prefetch_depth": 2})");
  EXPECT_FALSE(check_cost(two, two.root(), 0).has_value());  // the calibration's depth, whatever the trace
}

std::string sized(std::string_view sizes, std::string_view traces) {
  std::string text = R"({"format": "stowage-sized-lifetimes", "version": 1, "sizes": )";
  text.append(sizes).append(R"(, "profiles": [)").append(traces).append("]}");
  return text;
}

std::string sized_verdict(const std::string& text) {
  JsonDocument document(text);
  return verdict(read_sized(document, document.root()));
}

TEST(FileFormatsTest, ASizedTraceChecksItsGridBeforeItsTraces) {
  const std::string two = std::string(kTrace).append(", ").append(kTrace);
  {
    JsonDocument document(sized(R"({"batch": [2, 4]})", two));
    const ReadDocument read = read_sized(document, document.root());
    EXPECT_EQ(verdict(read), "read");
    EXPECT_EQ(read.traces.size(), 2u);
  }
  EXPECT_EQ(sized_verdict(sized(R"({"a": [1, 2, 3, 4, 5, 6, 7, 8, 9]})", "")), "sizes.a: a list of 9 items is above 8");
  EXPECT_EQ(sized_verdict(sized(R"({"a": [1, 2, 3, 4, 5, 6, 7, 8], "b": [1, 2, 3, 4, 5, 6, 7, 8],
                                    "c": [1, 2, 3, 4, 5, 6, 7, 8]})",
                                "")),
            "sizes: a grid of 512 points is above 256");
  EXPECT_EQ(sized_verdict(sized(R"({"a": [2, 4, 2]})", "")), "sizes.a: [2, 4, 2] repeats a point");
  EXPECT_EQ(sized_verdict(sized(R"({"a": [2]})", "")), "sizes.a: a list of 1 items is below 2");
  EXPECT_EQ(sized_verdict(sized(R"({"a": [0, 2]})", "")), "sizes.a[0]: 0 is below 1");
  EXPECT_EQ(sized_verdict(sized(R"({"a": [2, 4], "b": "x"})", "")), "sizes.b: expected a list, got a string ('x')");
  EXPECT_EQ(sized_verdict(sized(R"({})", "")), "sizes: expected an object of 1 to 8 sizes, got an object of 0 fields");
  EXPECT_EQ(sized_verdict(sized(R"({"a": [2, 4]})", kTrace)), "profiles: 1 profiles for a grid of 2 points");
  EXPECT_EQ(sized_verdict(sized(R"({"a": [2, 4]})", std::string(kTrace).append(", 3"))),
            "profiles[1]: expected an object, got an integer (3)");
  const std::string bad = std::string(kTrace).append(", ").append(replaced(kTrace, R"("bytes": 50)", R"("bytes": -5)"));
  EXPECT_EQ(sized_verdict(sized(R"({"a": [2, 4]})", bad)), "profiles[1].tensors[1].bytes: -5 is below 0");
}

std::string plan(std::string_view decisions, std::string_view budget = "1000") {
  std::string text = R"({"format": "stowage-plan", "version": 1, "budget": )";
  text.append(budget).append(R"(, "decisions": [)").append(decisions).append(R"(], "profile": )");
  return text.append(kTrace).append("}");
}

std::string plan_verdict(const std::string& text) {
  JsonDocument document(text);
  return verdict(read_plan(document, document.root()));
}

TEST(FileFormatsTest, APlansDecisionsAreCheckedAgainstItsTrace) {
  EXPECT_EQ(plan_verdict(plan(R"("recompute", "recompute", "offload")")), "read");
  JsonDocument read(plan(R"("recompute", "keep", "offload")"));
  EXPECT_EQ(read_plan(read, read.root()).decisions, (Plan{Decision::kRecompute, Decision::kKeep, Decision::kOffload}));
  EXPECT_EQ(plan_verdict(plan(R"("keep", "keep", "keep")", "0")),
            "budget: 0 is below 1");
  EXPECT_EQ(plan_verdict(plan(R"("keep", "keep")")), "decisions: 2 decisions for 3 saved tensors");
  EXPECT_EQ(plan_verdict(plan(R"("keep", "keep", "maybe")")),
            "decisions[2]: 'maybe' is not one of 'keep', 'offload', 'recompute'");
  EXPECT_EQ(plan_verdict(plan(R"("keep", "keep", "recompute")")),
            "decisions[2]: 'recompute' for a tensor that cannot be recomputed (not recomputable, or in no "
            "checkpoint region)");
  EXPECT_EQ(plan_verdict(plan(R"("keep", "offload", "keep")")),
            "decisions[1]: 'offload' for a tensor that cannot be offloaded");
  EXPECT_EQ(plan_verdict(plan(R"("offload", "recompute", "keep")")),
            "decisions[1]: 'recompute' in region 0, where saved tensor 0 is offloaded: a region recomputes or "
            "offloads, never both (a checkpoint keeps what it saves out of the offloader's reach)");
  const std::string bad = replaced(plan(R"("keep", "keep", "keep")"), R"("prefetch_depth": 2)", R"("prefetch_depth": -1)");
  EXPECT_EQ(plan_verdict(bad), "profile.cost.prefetch_depth: -1 is below 0");
  EXPECT_EQ(plan_verdict(R"({"format": "stowage-plan", "version": 1, "budget": 1, "decisions": [], "profile": []})"),
            "profile: expected an object, got a list");
}

TEST(FileFormatsTest, DecisionProblemsNameWhyTheRuntimeCannotApplyOne) {
  EXPECT_FALSE(decision_problem(Decision::kRecompute, true, false, 0).has_value());
  EXPECT_TRUE(decision_problem(Decision::kRecompute, true, true, kNoRegion).has_value());
  EXPECT_TRUE(decision_problem(Decision::kOffload, true, false, 0).has_value());
  EXPECT_FALSE(decision_problem(Decision::kKeep, false, false, kNoRegion).has_value());
}

TEST(FileFormatsTest, APlanMadeInMemoryIsCheckedAgainstItsTraceOnce) {
  JsonDocument document(kTrace);
  LifetimeTrace trace = read_lifetimes(document, document.root()).traces.front();
  constexpr auto K = Decision::kKeep;
  EXPECT_EQ(plan_problem(trace, {Decision::kRecompute, K, Decision::kOffload}), std::nullopt);
  EXPECT_EQ(plan_problem(trace, {K}), "a plan needs one decision per saved tensor: 1 for 3");
  EXPECT_EQ(plan_problem(trace, {K, Decision::kOffload, K}),
            "stowage.plan: saved tensor 1 (b.fc1): 'offload' for a tensor that cannot be offloaded");
  trace.tensors[0].region = 9;
  EXPECT_EQ(plan_problem(trace, {K, K, K}),
            "stowage.plan: saved tensor 0 (b.fc0): region 9 is not one of the trace's 1 regions");
}

}  // namespace
}  // namespace stowage::planner
