// `stowage doctor`'s tables over a report: the order of the sections, and what each cell says for
// the facts a machine may lack (no GPU, no driver version, unknown memory, hwloc failing, no torch).
#include "device/machine_report.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "base/byte_units.hpp"

namespace stowage {
namespace {

const FactsTable& table_titled(const std::vector<FactsTable>& tables, const std::string& title) {
  for (const FactsTable& table : tables) {
    if (table.title == title) return table;
  }
  throw std::runtime_error("no table " + title);
}

std::string value_of(const FactsTable& table, const std::string& fact) {
  for (const auto& row : table.rows) {
    if (row.at(0) == fact) return row.at(1);
  }
  return "(no row " + fact + ")";
}

MachineReport a_machine() {
  MachineReport report;
  report.driver = {"/lib/libcuda.so.1", "13.0", 1, std::nullopt, {}};
  report.runtime = {"/lib/libcudart.so.13", "13.0", 1, std::nullopt};
  ReportedGpu gpu;
  gpu.facts = {0, "NVIDIA H100", std::uint64_t{80} << 30, "0000:19:00.0", "9.0", true};
  gpu.numa_nodes = std::vector<std::int64_t>{0, 1};
  report.gpus.push_back(gpu);
  report.torch.installed = true;
  report.torch.version = "2.11.0";
  report.torch.cuda_build = "13.0";
  report.torch.cuda_device_count = 1;
  report.torch.module = {true, std::nullopt, "2.11.0", true, true, {"2.11"}, true, false};
  report.torch.environment = {{"STOWAGE_ALLOC_CONF", "''"}};
  report.memory = {std::uint64_t{64} << 30, std::uint64_t{32} << 30, std::nullopt, std::uint64_t{8} << 20,
                   std::nullopt};
  report.numa.hwloc_api_version = "2.8.0";
  report.numa.packages = 1;
  report.numa.cores = 2;
  report.numa.processing_units = 4;
  report.numa.nodes = {{0, std::uint64_t{32} << 30, "0-1", true}, {1, std::uint64_t{32} << 30, "2-3", false}};
  report.numa.process_cpus = "0-3";
  report.numa.process_numa_nodes = {0, 1};
  return report;
}

TEST(MachineReport, SectionsComeInTheirOrder) {
  std::vector<std::string> titles;
  for (const FactsTable& table : machine_report_tables(a_machine())) titles.push_back(table.title);
  EXPECT_EQ(titles,
            (std::vector<std::string>{"stowage", "CUDA", "GPUs", "torch", "host memory", "NUMA", "NUMA nodes"}));
}

TEST(MachineReport, AMachineWithAGpu) {
  const auto tables = machine_report_tables(a_machine());
  const FactsTable& cuda = table_titled(tables, "CUDA");
  EXPECT_EQ(value_of(cuda, "driver"), "CUDA 13.0 (/lib/libcuda.so.1)");
  EXPECT_EQ(value_of(cuda, "driver devices"), "1");
  const FactsTable& gpus = table_titled(tables, "GPUs");
  ASSERT_EQ(gpus.columns.size(), 7u);
  EXPECT_EQ(gpus.rows.at(0), (std::vector<std::string>{"0", "NVIDIA H100", format_bytes(std::uint64_t{80} << 30),
                                                        "0000:19:00.0", "9.0", "yes", "0,1"}));
  const FactsTable& torch = table_titled(tables, "torch");
  EXPECT_EQ(value_of(torch, "stowage._torch"), "built for torch 2.11.0");
  EXPECT_EQ(value_of(torch, "stowage is the CUDA allocator"), "yes");
  EXPECT_EQ(value_of(torch, "STOWAGE_ALLOC_CONF"), "''");
  EXPECT_EQ(value_of(table_titled(tables, "stowage"), "torch CUDA allocator"), "built for torch 2.11");
  const FactsTable& memory = table_titled(tables, "host memory");
  EXPECT_EQ(value_of(memory, "cgroup's room"), "no limit");
  EXPECT_EQ(value_of(memory, "locked-memory limit (ulimit -l)"), "8.00 MiB (hard: unlimited)");
  EXPECT_EQ(value_of(table_titled(tables, "NUMA"), "machine"),
            "1 package(s), 2 cores, 4 hardware threads, 2 NUMA node(s)");
  EXPECT_EQ(value_of(table_titled(tables, "NUMA"), "this process"), "CPUs 0-3, NUMA node 0,1");
  EXPECT_EQ(table_titled(tables, "NUMA nodes").rows.at(1).at(3), "no");
}

TEST(MachineReport, UnknownFactsReadAsUnknown) {
  MachineReport report = a_machine();
  report.driver = {std::nullopt, "13.0", 0, "cuInit failed", {}};
  report.runtime = {std::nullopt, std::nullopt, std::nullopt, std::nullopt};
  ReportedGpu unknown;
  unknown.facts.index = 1;
  unknown.facts.pci_bus_id = "";
  report.gpus.push_back(unknown);
  report.memory.available_bytes.reset();
  const auto tables = machine_report_tables(report);
  const FactsTable& cuda = table_titled(tables, "CUDA");
  EXPECT_EQ(value_of(cuda, "driver"), "CUDA 13.0 (None)");
  EXPECT_EQ(value_of(cuda, "driver devices"), "0 (cuInit failed)");
  EXPECT_EQ(value_of(cuda, "runtime"), "unknown");
  EXPECT_EQ(value_of(cuda, "runtime devices"), "none (None)");
  EXPECT_EQ(table_titled(tables, "GPUs").rows.at(1),
            (std::vector<std::string>{"1", "?", "?", "?", "?", "unknown", "unknown"}));
  EXPECT_EQ(value_of(table_titled(tables, "host memory"), "available"), "unknown");
}

TEST(MachineReport, NoGpuNoTorchNoHwloc) {
  MachineReport report = a_machine();
  report.gpus.clear();
  report.driver.error = "no NVIDIA driver";
  report.torch = {};
  report.torch.error = "No module named 'torch'";
  report.numa_error = "hwloc: broken";
  const auto tables = machine_report_tables(report);
  EXPECT_EQ(value_of(table_titled(tables, "GPUs"), "none"), "no NVIDIA driver");
  EXPECT_EQ(table_titled(tables, "torch").rows,
            (std::vector<std::vector<std::string>>{{"installed", "no (No module named 'torch')"}}));
  EXPECT_EQ(value_of(table_titled(tables, "stowage"), "torch CUDA allocator"), "not built");
  EXPECT_EQ(tables.back().title, "NUMA");
  EXPECT_EQ(tables.back().rows, (std::vector<std::vector<std::string>>{{"hwloc", "hwloc: broken"}}));
}

TEST(MachineReport, AStowageModuleForAnotherTorch) {
  MachineReport report = a_machine();
  report.torch.module = {true, std::nullopt, "2.10.0", false, true, {}, false, false};
  report.torch.cuda_device_count.reset();
  report.torch.cuda_build.reset();
  const auto tables = machine_report_tables(report);
  const FactsTable& torch = table_titled(tables, "torch");
  EXPECT_EQ(value_of(torch, "stowage._torch"), "built for torch 2.10.0 (not this torch)");
  EXPECT_EQ(value_of(torch, "GPUs torch sees"), "-");
  EXPECT_EQ(value_of(torch, "CUDA build"), "none (CPU-only build)");
  EXPECT_EQ(value_of(table_titled(tables, "stowage"), "torch CUDA allocator"), "built");
  report.torch.module = {false, "undefined symbol", std::nullopt, false, false, {}, false, false};
  EXPECT_EQ(value_of(table_titled(machine_report_tables(report), "torch"), "stowage._torch"),
            "cannot be imported: undefined symbol");
}

}  // namespace
}  // namespace stowage
