// OffloadReport: the forward's figures from the allocator's readings, and the report's text.
#include "offload/offload_report.hpp"

#include <gtest/gtest.h>

namespace stowage::offload {
namespace {

OffloadReport counted() {
  OffloadReport report;
  report.saved_bytes = 10 << 20;
  report.offloaded_bytes = 6 << 20;
  report.parameter_bytes = 1 << 20;
  report.small_bytes = 512;
  report.elsewhere_bytes = 1 << 20;
  report.host_full_bytes = 0;
  report.num_saved = 12;
  report.num_shared = 2;
  return report;
}

TEST(OffloadReport, TheForwardCountsOffloadedStoragesAsIfStillThere) {
  OffloadReport report = counted();
  // 3 MiB more allocated at the end; of the 6 MiB offloaded, 1 MiB is still alive (5 MiB freed).
  report.account_forward(100 << 20, 103 << 20, 1 << 20);
  EXPECT_EQ(report.forward_bytes, 8 << 20);
  EXPECT_EQ(report.unseen_bytes, 0);  // 8 activations' MiB saved: all of the forward's seen
  report.account_forward(100 << 20, 110 << 20, 1 << 20);
  EXPECT_EQ(report.forward_bytes, 15 << 20);
  EXPECT_EQ(report.unseen_bytes, 7 << 20);
  report.account_forward(100 << 20, 50 << 20, 6 << 20);  // less than at the start: nothing left
  EXPECT_EQ(report.forward_bytes, 0);
  EXPECT_EQ(report.unseen_bytes, 0);
}

TEST(OffloadReport, TheTextNamesEachFigureAndTheStoragesHeldElsewhereOnlyWhenThereAreSome) {
  OffloadReport report = counted();
  report.account_forward(0, 9 << 20, 0);
  EXPECT_EQ(report.text(),
            "offload: 12 saved tensors, 10.00 MiB in distinct storages\n"
            "  offloaded       6.00 MiB\n"
            "  parameters      1.00 MiB (never offloaded)\n"
            "  kept            3.00 MiB (small 512 B, no host memory 0 B, not stowage's memory 1.00 MiB)\n"
            "  forward left    15.00 MiB allocated, of which 7.00 MiB held outside saved tensors");
  report.held_elsewhere_bytes = 2 << 20;
  EXPECT_EQ(report.text(),
            "offload: 12 saved tensors, 10.00 MiB in distinct storages\n"
            "  offloaded       6.00 MiB\n"
            "    of which 2.00 MiB still referenced as the region ended (kept, read in place)\n"
            "  parameters      1.00 MiB (never offloaded)\n"
            "  kept            3.00 MiB (small 512 B, no host memory 0 B, not stowage's memory 1.00 MiB)\n"
            "  forward left    15.00 MiB allocated, of which 7.00 MiB held outside saved tensors");
}

}  // namespace
}  // namespace stowage::offload
