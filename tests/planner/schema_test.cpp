// The schema walker (planner/schema.hpp): each spec's refusals word for word (the field's path,
// the value, the bound and its reason), bounds the document sets, integers beyond 64 bits, and a
// hostile nesting refused at the schema's depth without walking it.
#include "planner/schema.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "tests/planner/json_document.hpp"

namespace stowage::planner {
namespace {

using testing::JsonDocument;
using testing::JsonNode;

// The refusal's "field: problem", or "accepted".
std::string verdict(const Spec& spec, std::string_view text, std::vector<std::int64_t> bounds = {},
                    const std::string& field = {}) {
  JsonDocument document(text);
  const auto refusal = check(document, document.root(), spec, bounds, field);
  if (!refusal) return "accepted";
  return refusal->field.empty() ? refusal->problem : refusal->field + ": " + refusal->problem;
}

TEST(SchemaTest, IntRefusesOtherKindsAndValuesOutsideItsBoundsNamingTheReason) {
  const IntSpec spec(Bound::of(0), Bound::of(std::int64_t{1} << 50), "2**50 bytes, 1 PiB: beyond any device");
  EXPECT_EQ(verdict(spec, "0"), "accepted");
  EXPECT_EQ(verdict(spec, "1125899906842624"), "accepted");
  EXPECT_EQ(verdict(spec, "1125899906842625"),
            "1125899906842625 is above 1125899906842624 (2**50 bytes, 1 PiB: beyond any device)");
  EXPECT_EQ(verdict(spec, "-1"), "-1 is below 0");
  EXPECT_EQ(verdict(spec, "true"), "expected an integer, got a boolean (true)");
  EXPECT_EQ(verdict(spec, "1.0"), "expected an integer, got a number (1.0)");
  EXPECT_EQ(verdict(spec, "null"), "expected an integer, got null");
  EXPECT_EQ(verdict(spec, "[1]"), "expected an integer, got a list");
  EXPECT_EQ(verdict(spec, "\"12\""), "expected an integer, got a string ('12')");
  // Beyond 64 bits: refused by its sign, quoted as the view quotes it.
  EXPECT_EQ(verdict(spec, "100000000000000000000000000000"),
            "100000000000000000000000000000 is above 1125899906842624 (2**50 bytes, 1 PiB: beyond any device)");
  EXPECT_EQ(verdict(spec, "-100000000000000000000000000000"), "-100000000000000000000000000000 is below 0");
}

TEST(SchemaTest, BoundsTheDocumentSetsAreLookedUpAndNamed) {
  const IntSpec spec(Bound::of(-1), Bound::ref(1, "the trace's last checkpoint region"));
  EXPECT_EQ(verdict(spec, "3", {9, 3}), "accepted");
  EXPECT_EQ(verdict(spec, "99", {9, 3}), "99 is above 3, the trace's last checkpoint region");
  EXPECT_EQ(verdict(spec, "0", {9, -1}), "0 is above -1, the trace's last checkpoint region");
  EXPECT_EQ(verdict(spec, "-2", {9, 3}), "-2 is below -1");
}

TEST(SchemaTest, NumberTakesIntegersAndFiniteRealsQuotedAsPythonWritesThem) {
  const NumberSpec link(Bound::of_real(1e3), Bound::of_real(1e12), "1 MB/s to 1 PB/s, in bytes per ms");
  EXPECT_EQ(verdict(link, "8e6"), "accepted");
  EXPECT_EQ(verdict(link, "1000"), "accepted");
  EXPECT_EQ(verdict(link, "1e-9"), "1e-09 is below 1000.0");
  EXPECT_EQ(verdict(link, "1e30"), "1e+30 is above 1000000000000.0 (1 MB/s to 1 PB/s, in bytes per ms)");
  EXPECT_EQ(verdict(link, "NaN"), "nan is not a finite number");
  EXPECT_EQ(verdict(link, "Infinity"), "inf is not a finite number");
  EXPECT_EQ(verdict(link, "false"), "expected a number, got a boolean (false)");
  EXPECT_EQ(verdict(link, "100000000000000000000000000000"),
            "100000000000000000000000000000 is above 1000000000000.0 (1 MB/s to 1 PB/s, in bytes per ms)");
}

TEST(SchemaTest, RealTextIsPythonsRepr) {
  EXPECT_EQ(real_text(1000.0), "1000.0");
  EXPECT_EQ(real_text(86'400'000.0), "86400000.0");
  EXPECT_EQ(real_text(1e12), "1000000000000.0");
  EXPECT_EQ(real_text(1e16), "1e+16");
  EXPECT_EQ(real_text(1e15), "1000000000000000.0");
  EXPECT_EQ(real_text(0.0001), "0.0001");
  EXPECT_EQ(real_text(0.00001), "1e-05");
  EXPECT_EQ(real_text(0.1), "0.1");
  EXPECT_EQ(real_text(1.5e300), "1.5e+300");
  EXPECT_EQ(real_text(-0.0), "-0.0");
  EXPECT_EQ(real_text(123.456), "123.456");
  EXPECT_EQ(real_text(-INFINITY), "-inf");
}

TEST(SchemaTest, GroupedWritesDigitsAsPythonsCommaFormat) {
  EXPECT_EQ(grouped(std::int64_t{0}), "0");
  EXPECT_EQ(grouped(std::int64_t{999}), "999");
  EXPECT_EQ(grouped(std::int64_t{1000}), "1,000");
  EXPECT_EQ(grouped(std::int64_t{-1234567}), "-1,234,567");
  EXPECT_EQ(grouped(static_cast<WideCount>(std::uint64_t{1} << 63) * 4), "36,893,488,147,419,103,232");
}

TEST(SchemaTest, TextChoiceAndBoolNameWhatTheyExpect) {
  EXPECT_EQ(verdict(TextSpec(4), "\"abcd\""), "accepted");
  EXPECT_EQ(verdict(TextSpec(4), "\"abcde\""), "a string of 5 characters is above 4");
  EXPECT_EQ(verdict(TextSpec(3), "\"\xc3\xa9\xc3\xa9\xc3\xa9\""), "accepted");  // characters, not bytes
  EXPECT_EQ(verdict(TextSpec(4), "[]"), "expected a string, got a list");
  // A lone surrogate, as a view gives one back (encoded as written), and bytes that are not UTF-8.
  const std::string not_text =
      "a string that is not text: it holds a lone surrogate (U+D800 to U+DFFF) or bytes that are not UTF-8";
  EXPECT_EQ(verdict(TextSpec(9), "\"a\xed\xa0\x80\""), not_text);
  EXPECT_EQ(verdict(TextSpec(9), "\"\xff\""), not_text);
  EXPECT_EQ(verdict(TextSpec(9), "\"\xc0\xaf\""), not_text);  // an overlong '/'
  EXPECT_EQ(verdict(TextSpec(9), "\"\xf0\x9f\x98\x80\""), "accepted");  // past the BMP
  const ChoiceSpec phase({"forward", "backward"});
  EXPECT_EQ(verdict(phase, "\"backward\""), "accepted");
  EXPECT_EQ(verdict(phase, "\"sideways\""), "'sideways' is not one of 'forward', 'backward'");
  EXPECT_EQ(verdict(phase, "3"), "3 is not one of 'forward', 'backward'");
  EXPECT_EQ(verdict(BoolSpec(), "1"), "expected true or false, got an integer (1)");
}

TEST(SchemaTest, ListsAndRowsCountTheirItemsAndNameTheIndexRefused) {
  const ListSpec list(std::make_shared<IntSpec>(Bound::of(0), Bound::of(9)), Bound::of(3), 1);
  EXPECT_EQ(verdict(list, "[1, 2, 3]"), "accepted");
  EXPECT_EQ(verdict(list, "[1, 2, 3, 4]"), "a list of 4 items is above 3");
  EXPECT_EQ(verdict(list, "[]"), "a list of 0 items is below 1");
  EXPECT_EQ(verdict(list, "[1, 20]", {}, "sizes"), "sizes[1]: 20 is above 9");
  EXPECT_EQ(verdict(list, "{}"), "expected a list, got an object");
  const RowSpec row({std::make_shared<TextSpec>(8), std::make_shared<IntSpec>(Bound::of(-1), Bound::of(9))});
  EXPECT_EQ(verdict(row, "[\"a\", -1]"), "accepted");
  EXPECT_EQ(verdict(row, "[\"a\"]"), "expected a list of 2 items, got a list of 1 items");
  EXPECT_EQ(verdict(row, "[\"a\", -2]"), "[1]: -2 is below -1");
}

TEST(SchemaTest, RecordsRefuseUnknownAndMissingFieldsAndNameTheFieldPath) {
  const auto item = std::make_shared<RecordSpec>(
      RecordSpec::Fields{{"bytes", std::make_shared<IntSpec>(Bound::of(0), Bound::of(100), "a hundred")}},
      RecordSpec::Fields{{"note", std::make_shared<TextSpec>(8)}});
  const RecordSpec spec(RecordSpec::Fields{{"tensors", std::make_shared<ListSpec>(item, Bound::of(10))}});
  EXPECT_EQ(verdict(spec, R"({"tensors": [{"bytes": 1}, {"bytes": 2, "note": "x"}]})"), "accepted");
  EXPECT_EQ(verdict(spec, R"({"tensors": [{"bytes": 1}, {"bytes": 200}]})"),
            "tensors[1].bytes: 200 is above 100 (a hundred)");
  EXPECT_EQ(verdict(spec, R"({"tensors": [{"bytes": 1}, {"bytes": 2}]})", {}, "profile"), "accepted");
  EXPECT_EQ(verdict(spec, R"({"tensors": [{"bytes": 1, "extra": 1}]})", {}, "profile"),
            "profile.tensors[0]: unknown field 'extra' (fields: bytes, note)");
  EXPECT_EQ(verdict(spec, R"({"tensors": [{"note": "x"}]})"), "tensors[0]: missing field 'bytes'");
  EXPECT_EQ(verdict(spec, R"({})"), "missing field 'tensors'");
  EXPECT_EQ(verdict(spec, R"([])"), "expected an object, got a list");
}

TEST(SchemaTest, AHostileNestingIsRefusedAtTheSchemasDepthWithoutWalkingIt) {
  JsonDocument document;
  JsonNode* outer = document.add(JsonNode{DocKind::kList, false, 0, false, 0, {}, {}});
  JsonNode* at = outer;
  for (int depth = 0; depth < 1'000'000; ++depth) {  // [[[[...]]]], a million deep
    JsonNode* inner = document.add(JsonNode{DocKind::kList, false, 0, false, 0, {}, {}});
    at->items.push_back(inner);
    at = inner;
  }
  const ListSpec spec(std::make_shared<ListSpec>(std::make_shared<IntSpec>(Bound::of(0), Bound::of(9)), Bound::of(9)),
                      Bound::of(9));
  const auto refusal = check(document, outer, spec);
  ASSERT_TRUE(refusal.has_value());
  EXPECT_EQ(refusal->field, "[0][0]");
  EXPECT_EQ(refusal->problem, "expected an integer, got a list");
}

TEST(SchemaTest, FieldPathsJoinNamesAndIndices) {
  EXPECT_EQ(field_path("", {at_name("bytes"), at_index(3), at_name("tensors")}), "tensors[3].bytes");
  EXPECT_EQ(field_path("profiles[2]", {at_name("ops")}), "profiles[2].ops");
  EXPECT_EQ(refuse("profile", {at_name("decisions"), at_index(0)}, "p").field, "profile.decisions[0]");
  EXPECT_EQ(refuse("", {}, "p").field, "");
}

}  // namespace
}  // namespace stowage::planner
