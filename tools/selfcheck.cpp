// stowage_selfcheck: shows, on this machine, that the device seam works.
//
// It runs a short tour of each available backend (the simulated HostBackend always, CudaBackend
// when a GPU is present) and prints one line per check with what it measured. Exit status 0
// when every check passed, 1 otherwise. Options: --capacity GiB (simulated device size, default
// 80), --host-only.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "base/build_info.hpp"
#include "base/errors.hpp"
#include "device/backend.hpp"
#include "device/host/host_backend.hpp"
#if STOWAGE_HAVE_CUDA
#include "device/cuda/cuda_backend.hpp"
#endif

namespace {

using stowage::DeviceBackend;
using stowage::kGiB;
using stowage::kMiB;

int g_failures = 0;

void report(bool ok, const std::string& check, const std::string& detail) {
  if (!ok) ++g_failures;
  std::cout << "  [" << (ok ? " ok " : "FAIL") << "] " << std::left << std::setw(34) << check
            << detail << "\n";
}

// Runs one check; an exception is a failure whose message is the detail.
void run_check(const std::string& name, const std::function<std::string()>& body) {
  try {
    report(true, name, body());
  } catch (const std::exception& error) {
    report(false, name, error.what());
  }
}

std::string gib(std::size_t bytes) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(bytes % kGiB == 0 ? 0 : 2)
      << static_cast<double>(bytes) / static_cast<double>(kGiB) << " GiB";
  return out.str();
}

std::size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t pages = 0;
  std::size_t resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

void require(bool condition, const std::string& what) {
  if (!condition) throw std::runtime_error(what);
}

std::vector<char> filled(std::size_t bytes, char seed) {
  std::vector<char> out(bytes);
  for (std::size_t i = 0; i < bytes; ++i) out[i] = static_cast<char>(seed + static_cast<char>(i % 251));
  return out;
}

// Three physical chunks mapped into one contiguous range; a second view of one sees the same bytes.
std::string check_stitching(DeviceBackend& backend) {
  const std::size_t g = backend.properties().granularity;
  // Three separate physical chunks, mapped in reverse order into one contiguous range.
  char* range = static_cast<char*>(backend.reserve_address_range(3 * g));
  std::vector<stowage::PhysicalHandle> chunks;
  for (int i = 0; i < 3; ++i) {
    const auto chunk = backend.try_create_physical(g);
    require(chunk.has_value(), "out of memory creating a chunk");
    chunks.push_back(*chunk);
  }
  for (int i = 2; i >= 0; --i) backend.map(range + static_cast<std::size_t>(i) * g, g, chunks[static_cast<std::size_t>(i)]);
  backend.set_access(range, 3 * g);
  // A second view of the middle chunk sees what was written through the stitched range.
  char* view = static_cast<char*>(backend.reserve_address_range(g));
  backend.map(view, g, chunks[1]);
  backend.set_access(view, g);
  const auto data = filled(3 * g, 7);
  std::vector<char> back(g);
  backend.copy_async(range, data.data(), 3 * g, stowage::Stream{0});
  backend.copy_async(back.data(), view, g, stowage::Stream{0});
  backend.synchronize_stream(stowage::Stream{0});
  require(std::memcmp(back.data(), data.data() + g, g) == 0, "second view disagrees");
  backend.unmap(view, g);
  backend.unmap(range, 3 * g);
  for (const auto chunk : chunks) backend.release_physical(chunk);
  backend.release_address_range(view, g);
  backend.release_address_range(range, 3 * g);
  return "3 chunks of " + std::to_string(g / kMiB) + " MiB, mapped in reverse; 2 views agree";
}

// The VMM rule that a mapping is unmapped whole, never in part.
std::string check_no_partial_unmap(DeviceBackend& backend) {
  const std::size_t g = backend.properties().granularity;
  char* range = static_cast<char*>(backend.reserve_address_range(2 * g));
  const auto chunk = backend.try_create_physical(2 * g);
  require(chunk.has_value(), "out of memory creating a chunk");
  backend.map(range, 2 * g, *chunk);
  std::string refusal = "accepted (rule not enforced)";
  bool refused = false;
  try {
    backend.unmap(range, g);
  } catch (const stowage::Error& error) {
    refused = true;
    refusal = error.message();
  }
  backend.unmap(range, 2 * g);
  backend.release_physical(*chunk);
  backend.release_address_range(range, 2 * g);
  require(refused, refusal);
  return "refused: " + refusal.substr(0, 60) + (refusal.size() > 60 ? "..." : "");
}

// A stream waits for an event of another before it reads what that one wrote.
std::string check_streams(DeviceBackend& backend) {
  const stowage::Stream producer = backend.create_stream();
  const stowage::Stream consumer = backend.create_stream();
  const stowage::Event ready = backend.create_event();
  const std::size_t bytes = 64 * kMiB;
  void* device = backend.try_allocate_segment(bytes);
  require(device != nullptr, "out of memory");
  const auto data = filled(bytes, 3);
  std::vector<char> back(bytes, 0);
  const auto start = std::chrono::steady_clock::now();
  backend.copy_async(device, data.data(), bytes, producer);
  backend.record_event(ready, producer);
  backend.stream_wait_event(consumer, ready);
  backend.copy_async(back.data(), device, bytes, consumer);
  backend.synchronize_stream(consumer);
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  require(backend.query_event(ready), "event not complete after the waiting stream finished");
  require(back == data, "the consumer read before the producer's copy completed");
  backend.free_segment(device);
  backend.destroy_event(ready);
  backend.destroy_stream(producer);
  backend.destroy_stream(consumer);
  std::ostringstream out;
  out << "2 x 64 MiB copies across two streams, " << std::fixed << std::setprecision(1)
      << 2.0 * static_cast<double>(bytes) / elapsed.count() / 1e9 << " GB/s (pageable host)";
  return out.str();
}

// Checks that hold on every backend.
void tour_common(DeviceBackend& backend) {
  if (backend.properties().virtual_memory) {
    run_check("stitching: chunks into one range", [&] { return check_stitching(backend); });
    run_check("VMM rule: no partial unmap", [&] { return check_no_partial_unmap(backend); });
  }
  run_check("streams: events and ordering", [&] { return check_streams(backend); });
}

void tour_host(std::size_t capacity) {
  stowage::HostBackendOptions options;
  options.capacity_bytes = capacity;
  options.copy_bytes_per_second = 0;
  stowage::HostBackend backend(options);
  std::cout << backend.properties().name << ": " << gib(capacity) << ", granularity "
            << backend.properties().granularity / kMiB << " MiB, kernel mappings allowed "
            << backend.max_mappings() << "\n";

  run_check("capacity enforced", [&] {
    const std::size_t rss_before = resident_bytes();
    void* big = backend.try_allocate_segment(capacity * 3 / 4);
    require(big != nullptr, "a segment of 3/4 of the capacity was refused");
    const std::size_t rss_cost = resident_bytes() - rss_before;
    void* over = backend.try_allocate_segment(capacity / 2);
    const bool refused = over == nullptr;
    if (over != nullptr) backend.free_segment(over);
    const auto handle = backend.try_create_physical(capacity / 8);
    require(handle.has_value(), "a handle within capacity was refused");
    const bool handle_refused = !backend.try_create_physical(capacity / 4).has_value();
    backend.release_physical(*handle);
    backend.free_segment(big);
    require(refused && handle_refused, "allocation over capacity succeeded");
    require(backend.used_bytes() == 0, "memory not returned");
    return gib(capacity * 3 / 4) + " segment costs " + std::to_string(rss_cost / kMiB) +
           " MiB of RAM; over-capacity segment and handle refused";
  });

  run_check("fault injection", [&] {
    const std::size_t g = backend.properties().granularity;
    void* range = backend.reserve_address_range(g);
    const auto chunk = backend.try_create_physical(g);
    require(chunk.has_value(), "out of memory");
    backend.faults().fail_nth(stowage::BackendCall::kMap, 1);
    bool failed = false;
    try {
      backend.map(range, g, *chunk);
    } catch (const stowage::BackendError&) {
      failed = true;
    }
    backend.map(range, g, *chunk);  // the failed call left nothing behind
    backend.unmap(range, g);
    backend.release_physical(*chunk);
    backend.release_address_range(range, g);
    backend.check_invariants();
    require(failed, "the armed fault did not fire");
    return "armed map fault fired; retry succeeded; invariants hold";
  });

  tour_common(backend);
}

#if STOWAGE_HAVE_CUDA
void tour_cuda() {
  const int devices = stowage::cuda_device_count();
  if (devices == 0) {
    std::cout << "CudaBackend: built, but no GPU is visible here (skipped)\n";
    return;
  }
  for (int device = 0; device < devices; ++device) {
    const std::unique_ptr<DeviceBackend> opened = stowage::open_cuda_device(device);
    DeviceBackend& backend = *opened;
    const auto& properties = backend.properties();
    std::cout << "CudaBackend " << device << ": " << properties.name << ", "
              << gib(properties.total_bytes) << ", VMM "
              << (properties.virtual_memory ? "yes" : "no") << ", granularity "
              << properties.granularity / kMiB << " MiB, PCI " << properties.pci_bus_id << "\n";
    tour_common(backend);
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  std::size_t capacity = 80 * kGiB;
  bool host_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--capacity" && i + 1 < argc) {
      capacity = static_cast<std::size_t>(std::strtoull(argv[++i], nullptr, 10)) * kGiB;
    } else if (arg == "--host-only") {
      host_only = true;
    } else {
      std::cerr << "usage: stowage_selfcheck [--capacity GiB] [--host-only]\n";
      return 2;
    }
  }
  if (capacity == 0) {
    std::cerr << "stowage_selfcheck: --capacity needs a positive number of GiB\n";
    return 2;
  }
  namespace info = stowage::build_info;
  std::cout << "stowage " << info::kVersion << " self-check (" << info::kCompiler << ", "
            << info::kBuildType << "; CUDA backend "
            << (info::kWithCuda ? "built, CUDA " + std::string(info::kCudaVersion) : "not built")
            << "; torch " << info::kTorchVersion << ")\n";
  tour_host(capacity);
#if STOWAGE_HAVE_CUDA
  if (!host_only) tour_cuda();
#else
  (void)host_only;
#endif
  std::cout << (g_failures == 0 ? "all checks passed\n"
                                : std::to_string(g_failures) + " check(s) failed\n");
  return g_failures == 0 ? 0 : 1;
}
