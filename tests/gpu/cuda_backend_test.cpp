// CudaBackend joins the DeviceBackend conformance suite on every visible GPU. Without a GPU the
// factory returns nullptr and every case skips.
#include "base/errors.hpp"
#include "device/cuda/cuda_backend.hpp"
#include "tests/conformance/backend_conformance.hpp"

namespace stowage::testing {
namespace {

std::unique_ptr<DeviceBackend> make_cuda() {
  if (!cuda_available()) return nullptr;
  return open_cuda_device(0);
}

INSTANTIATE_TEST_SUITE_P(CudaBackend, BackendConformance,
                         ::testing::Values(BackendUnderTest{"gpu0", make_cuda, false}),
                         backend_test_name);

TEST(CudaBackend, DeviceCountNeverThrows) {
  EXPECT_GE(cuda_device_count(), 0);
}

TEST(CudaBackend, RefusesADeviceThatDoesNotExist) {
  EXPECT_THROW(open_cuda_device(-1), LogicError);
  EXPECT_THROW(open_cuda_device(cuda_device_count() + 7), Error);
}

TEST(CudaBackend, DescribesARealDevice) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  const std::unique_ptr<DeviceBackend> opened = open_cuda_device(0);
  DeviceBackend& backend = *opened;
  const DeviceProperties& properties = backend.properties();
  EXPECT_FALSE(properties.pci_bus_id.empty());
  EXPECT_GT(properties.total_bytes, std::size_t{1} << 30);
  if (properties.virtual_memory) {
    EXPECT_GE(properties.granularity, std::size_t{1} << 21);
  }
}

}  // namespace
}  // namespace stowage::testing
