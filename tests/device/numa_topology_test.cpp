// The machine's NUMA layout as hwloc reads it, and where a GPU sits in it by PCI bus id.
#include "device/numa_topology.hpp"

#include <gtest/gtest.h>

#include "base/errors.hpp"

namespace stowage {
namespace {

TEST(NumaTopology, ParsesBusIdsWithAndWithoutADomain) {
  const PciBusId full = parse_pci_bus_id("0000:3b:00.1");
  EXPECT_EQ(full.domain, 0u);
  EXPECT_EQ(full.bus, 0x3bu);
  EXPECT_EQ(full.device, 0u);
  EXPECT_EQ(full.function, 1u);
  const PciBusId short_form = parse_pci_bus_id("17:1f.0");
  EXPECT_EQ(short_form.bus, 0x17u);
  EXPECT_EQ(short_form.device, 0x1fu);
}

TEST(NumaTopology, RefusesWhatIsNoBusId) {
  EXPECT_THROW(parse_pci_bus_id(""), LogicError);
  EXPECT_THROW(parse_pci_bus_id("gpu0"), LogicError);
  EXPECT_THROW(parse_pci_bus_id("0000:3b:00"), LogicError);
}

TEST(NumaTopology, ReadsTheMachineAndAnswersForEveryBusIdAsked) {
  const NumaTopology topology = read_numa_topology({"0000:ff:1f.7"});
  EXPECT_FALSE(topology.hwloc_api_version.empty());
  EXPECT_GE(topology.nodes.size(), 1u) << "every machine has at least one NUMA node";
  EXPECT_GE(topology.processing_units, 1u);
  ASSERT_EQ(topology.pci_devices.size(), 1u);
  EXPECT_EQ(topology.pci_devices[0].bus_id, "0000:ff:1f.7");
  if (!topology.pci_devices[0].found) {
    EXPECT_TRUE(topology.pci_devices[0].numa_nodes.empty());
  }
}

}  // namespace
}  // namespace stowage
