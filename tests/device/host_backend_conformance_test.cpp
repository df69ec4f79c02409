// HostBackend joins the DeviceBackend conformance suite, with threaded and with synchronous
// streams, and with a granularity other than the default.
#include "device/host/host_backend.hpp"
#include "tests/conformance/backend_conformance.hpp"

namespace stowage::testing {
namespace {

std::unique_ptr<DeviceBackend> make_host(bool synchronous, std::size_t granularity) {
  HostBackendOptions options;
  options.capacity_bytes = 256 * kMiB;
  options.synchronous = synchronous;
  options.granularity = granularity;
  return std::make_unique<HostBackend>(options);
}

INSTANTIATE_TEST_SUITE_P(
    HostBackend, BackendConformance,
    ::testing::Values(
        BackendUnderTest{"threaded", [] { return make_host(false, 2 * kMiB); }, false},
        BackendUnderTest{"synchronous", [] { return make_host(true, 2 * kMiB); }, true},
        BackendUnderTest{"granularity64KiB", [] { return make_host(false, 64 * 1024); }, false}),
    backend_test_name);

}  // namespace
}  // namespace stowage::testing
