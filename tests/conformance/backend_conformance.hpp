// The DeviceBackend conformance suite: behaviour every backend must show (Note [Device seam]).
//
// A backend joins the suite in a few lines:
//
//   INSTANTIATE_TEST_SUITE_P(Host, BackendConformance,
//       ::testing::Values(BackendUnderTest{"threaded", [] { return make_my_backend(); }}),
//       backend_test_name);
//
// A factory that returns nullptr means "no such device here": every test then skips, which is
// how the CUDA instantiation behaves on a machine without a GPU.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "device/backend.hpp"
#include "tests/conformance/pattern.hpp"

namespace stowage::testing {

struct BackendUnderTest {
  std::string name;
  std::function<std::unique_ptr<DeviceBackend>()> make;
  // Stream work runs inline on the caller's thread: tests that block a stream are skipped.
  bool synchronous = false;
};

// gtest prints parameters with this: the backend's name rather than its bytes.
inline void PrintTo(const BackendUnderTest& backend, std::ostream* out) { *out << backend.name; }

std::string backend_test_name(const ::testing::TestParamInfo<BackendUnderTest>& info);

class BackendConformance : public ::testing::TestWithParam<BackendUnderTest> {
 protected:
  void SetUp() override;
  void TearDown() override;

  // Copies host bytes to device memory (or back) on `stream` and waits for the copy.
  void write(void* device, const std::vector<std::uint8_t>& bytes, Stream stream = {});
  std::vector<std::uint8_t> read(const void* device, std::size_t bytes, Stream stream = {});
  // Skips the calling test unless the backend has virtual memory.
  bool skip_without_virtual_memory();

  std::unique_ptr<DeviceBackend> backend_;
};

}  // namespace stowage::testing
