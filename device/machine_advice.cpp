#include "device/machine_advice.hpp"

#include <algorithm>
#include <cctype>
#include <string_view>

#include "base/byte_units.hpp"

namespace stowage {

namespace {

std::string shown(const std::optional<std::string>& text) { return text.value_or("None"); }

bool given(const std::optional<std::string>& text) { return text.has_value() && !text->empty(); }

// The first two numbers in a version ("12.4" -> 12, 4), compared as tuples are.
std::vector<std::int64_t> version_numbers(std::string_view text) {
  std::vector<std::int64_t> numbers;
  for (std::size_t i = 0; i < text.size() && numbers.size() < 2;) {
    if (std::isdigit(static_cast<unsigned char>(text[i])) == 0) {
      ++i;
      continue;
    }
    std::int64_t value = 0;
    for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])) != 0; ++i) {
      value = std::min<std::int64_t>(value * 10 + (text[i] - '0'), INT64_MAX / 10);
    }
    numbers.push_back(value);
  }
  return numbers;
}

std::string nodes_text(const std::vector<std::int64_t>& nodes) {
  std::string out;
  for (const std::int64_t node : nodes) {
    if (!out.empty()) out += ',';
    out += std::to_string(node);
  }
  return out;
}

std::string limit_text(const std::optional<std::uint64_t>& bytes) {
  return bytes ? format_bytes(*bytes) : "unlimited";
}

void advise_cuda(const MachineFacts& facts, std::vector<std::string>& advice) {
  if (facts.gpus.empty()) {
    const std::string reason = given(facts.driver_error) ? *facts.driver_error : "the driver reports no GPU";
    advice.push_back("No GPU (" + reason + "): stowage runs on the simulated device; CPU mode works "
                     "(stowage.enable(device='cpu', capacity='4GiB'), `stowage demo`), and so do `stowage replay` "
                     "and the C++ library.");
  } else if (facts.gpus.front().from_nvidia_smi) {
    advice.push_back("nvidia-smi lists " + std::to_string(facts.gpus.size()) + " GPU(s) but CUDA cannot use them (" +
                     shown(facts.driver_error) + "): CUDA_VISIBLE_DEVICES is " + facts.cuda_visible_devices +
                     "; check that the driver library and the kernel module are the same version.");
  } else if (!facts.stowage_with_cuda) {
    advice.push_back("stowage was built without the CUDA toolkit, so it cannot use the GPUs: install the toolkit "
                     "and reinstall stowage (tools/install).");
  }
  if (given(facts.driver_version) && given(facts.runtime_version) &&
      version_numbers(*facts.driver_version) < version_numbers(*facts.runtime_version)) {
    advice.push_back("The driver supports CUDA up to " + *facts.driver_version + " but the runtime is " +
                     *facts.runtime_version + " (" + shown(facts.runtime_library) +
                     "): CUDA calls fail with cudaErrorInsufficientDriver; update the driver, or use a torch built "
                     "for CUDA " + *facts.driver_version + " or older.");
  }
  for (const AdvisedGpu& gpu : facts.gpus) {
    if (gpu.virtual_memory_management == false) {
      advice.push_back("GPU " + std::to_string(gpu.index) + " (" + shown(gpu.name) +
                       ") has no virtual memory management: the paged path needs it; stowage falls back to "
                       "segments (virtual_memory:off).");
    }
  }
}

void advise_torch(const MachineFacts& facts, std::vector<std::string>& advice) {
  const TorchFacts& torch = facts.torch;
  const std::string version = shown(torch.version);
  if (!torch.installed) {
    advice.push_back("torch cannot be imported (" + shown(torch.import_error) +
                     "): stowage's torch allocator and CPU mode need it; `stowage replay` and the C++ library "
                     "work without.");
  } else if (!torch.module_importable) {
    advice.push_back("stowage._torch cannot be imported (" + shown(torch.module_error) +
                     "): reinstall stowage against this torch (tools/install).");
  } else if (!torch.matches_torch) {
    advice.push_back("stowage was built for torch " + shown(torch.built_for_torch) + " but torch " + version +
                     " is installed: reinstall stowage (tools/install).");
  } else if (!facts.gpus.empty() && !torch.cuda_build) {
    advice.push_back("torch " + version + " is a CPU-only build: install a CUDA build of torch, then reinstall "
                     "stowage (tools/install).");
  } else if (!facts.gpus.empty() && facts.stowage_with_cuda && !torch.cuda_allocator_built) {
    advice.push_back("stowage's torch CUDA allocator was not built for torch " + version +
                     " (it supports the versions named in python/CMakeLists.txt, STOWAGE_TORCH_CUDA_VERSIONS): use "
                     "the C library route, torch.cuda.memory.CUDAPluggableAllocator(stowage.c_library_path(), "
                     "'stowage_malloc', 'stowage_free') (no torch.cuda.memory_stats).");
  }
}

void advise_memlock(const MachineFacts& facts, std::vector<std::string>& advice) {
  if (!facts.memlock_soft || *facts.memlock_soft >= facts.total_memory) return;
  const std::uint64_t soft = *facts.memlock_soft;
  std::string now = "the hard limit is the same, and raising it needs CAP_SYS_RESOURCE";
  if (!facts.memlock_hard) {
    now = "`ulimit -l unlimited` in the shell that starts the job";
  } else if (*facts.memlock_hard > soft) {
    now = "`ulimit -l " + std::to_string(*facts.memlock_hard >> 10) +
          "` (the hard limit) in the shell that starts the job; beyond it needs CAP_SYS_RESOURCE";
  }
  advice.push_back("The locked-memory limit (ulimit -l) is " + limit_text(soft) + " of " +
                   limit_text(facts.total_memory) +
                   ". Memory the CUDA driver pins itself (cudaHostAlloc) does not count against it, but host memory "
                   "pinned by registering it (cudaHostRegister) and by other tools may; if pinning fails, raise it. "
                   "Now: " + now + "; for good: a memlock line in /etc/security/limits.conf ('* - memlock "
                   "unlimited'); in Docker: `docker run --ulimit memlock=-1`.");
}

void advise_numa(const MachineFacts& facts, std::vector<std::string>& advice) {
  if (given(facts.numa_error)) {
    advice.push_back("The NUMA topology is unknown (" + *facts.numa_error +
                     "), and with it each GPU's nearest NUMA node, where pinned host memory is best placed.");
    return;  // (no GPU's node is known either)
  }
  std::vector<std::int64_t> process = facts.process_numa_nodes;
  std::sort(process.begin(), process.end());
  process.erase(std::unique(process.begin(), process.end()), process.end());
  for (const AdvisedGpu& gpu : facts.gpus) {
    if (!given(gpu.pci_bus_id)) continue;
    if (!gpu.numa_nodes) {
      advice.push_back("hwloc does not list GPU " + std::to_string(gpu.index) + "'s PCI device " + *gpu.pci_bus_id +
                       ": its NUMA node is unknown (is /sys/bus/pci visible?).");
      continue;
    }
    const bool shared = std::any_of(gpu.numa_nodes->begin(), gpu.numa_nodes->end(), [&](std::int64_t node) {
      return std::binary_search(process.begin(), process.end(), node);
    });
    if (gpu.numa_nodes->empty() || process.empty() || shared) continue;
    const std::string nodes = nodes_text(*gpu.numa_nodes);
    advice.push_back("GPU " + std::to_string(gpu.index) + " is nearest NUMA node " + nodes + " (CPUs " +
                     shown(gpu.near_cpus) + "), but this process runs on CPUs " + shown(facts.process_cpus) +
                     " (node " + nodes_text(process) + "): host-device copies cross the socket link; run under "
                     "`numactl --cpunodebind=" + nodes + " --membind=" + nodes + "`.");
  }
}

}  // namespace

std::vector<std::string> machine_advice(const MachineFacts& facts) {
  std::vector<std::string> advice;
  advise_cuda(facts, advice);
  advise_torch(facts, advice);
  advise_memlock(facts, advice);
  advise_numa(facts, advice);
  return advice;
}

}  // namespace stowage
