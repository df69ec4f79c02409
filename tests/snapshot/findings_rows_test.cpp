// snapshot/findings_rows: the rows inspect's terminal and HTML reports share, cells as they show them.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "snapshot/findings_rows.hpp"

namespace stowage::snapshot {
namespace {

using Row = std::vector<std::string>;

TEST(FindingsRows, BytesAreFormattedSignedAndInFullPast64Bits) {
  EXPECT_EQ(bytes_text(0), "0 B");
  EXPECT_EQ(bytes_text(3 << 19), "1.50 MiB");
  EXPECT_EQ(bytes_text(-(3 << 19)), "-1.50 MiB");
  EXPECT_EQ(bytes_text(Wide{1} << 64), "18446744073709551616 B");
}

TEST(FindingsRows, SitesShareTheirTotalAndADashWithoutOne) {
  const std::vector<SiteLive> sites{{"train.py:7 forward", 3 << 20, 1234}, {"<unknown>", 1 << 20, 1}};
  EXPECT_EQ(site_rows(sites, 8 << 20),
            (TextRows{{"3.00 MiB", "37.5%", "1,234", "train.py:7 forward"}, {"1.00 MiB", "12.5%", "1", "<unknown>"}}));
  EXPECT_EQ(site_rows(sites, 0).at(0).at(1), "-");
}

TEST(FindingsRows, CategoriesLargestFirstTiesInOrderAndWhatWasLiveBeforeTheTraceLast) {
  Peak peak;
  peak.live_bytes = 10 << 20;
  peak.categories = {{"gradients", 2 << 20}, {"parameters", 4 << 20}, {"activations", 2 << 20}};
  const TextRows with_before = category_rows(peak, true);
  ASSERT_EQ(with_before.size(), 4u);
  EXPECT_EQ(with_before[0], (Row{"4.00 MiB", "40.0%", "parameters"}));
  EXPECT_EQ(with_before[1].at(2), "gradients");
  EXPECT_EQ(with_before[2].at(2), "activations");
  EXPECT_EQ(with_before[3], (Row{"2.00 MiB", "20.0%", "(live before the trace began)"}));
  EXPECT_EQ(category_rows(peak, false).size(), 3u);
  peak.live_bytes = 0;  // an empty peak shares over 1 byte, not 0
  EXPECT_EQ(category_rows(peak, true).at(0).at(1), "419430400.0%");
}

TEST(FindingsRows, ModulesHeldSegmentsAndSteps) {
  Peak peak;
  peak.live_bytes = 4 << 20;
  peak.modules = {{"model.layers.0", 1 << 20}, {"", 1 << 20}};
  EXPECT_EQ(module_rows(peak), (TextRows{{"1.00 MiB", "25.0%", "model.layers.0"},
                                         {"1.00 MiB", "25.0%", "(outside any module's forward)"}}));
  EXPECT_EQ(held_rows({{0x1000, 20 << 20, 512, 20 << 20, "a.py:1 f"}}),
            (TextRows{{"20.00 MiB", "512 B", "20.00 MiB", "a.py:1 f"}}));
  Step step;
  step.number = 3;
  step.first_event = 1000;
  step.last_event = 12345;
  step.peak_bytes = 2 << 20;
  step.end_bytes = 1 << 20;
  EXPECT_EQ(step_rows({step}), (TextRows{{"3", "1,000-12,345", "2.00 MiB", "1.00 MiB"}}));
}

}  // namespace
}  // namespace stowage::snapshot
