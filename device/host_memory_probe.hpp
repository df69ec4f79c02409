// HostMemoryFacts: what host memory this process may take, read once from the kernel.
//
// The one probe of host memory in stowage: the offloaded optimizer sizes its pinned states by it
// and `stowage doctor` reports it, so the two never disagree. Three limits bound what the process
// may allocate, and the smallest wins: the memory the kernel says is available (MemAvailable,
// which counts reclaimable caches, unlike MemFree), the cgroup's limit less what the cgroup
// already uses (v2 memory.max / memory.current of this process's own cgroup, else v1
// memory.limit_in_bytes / memory.usage_in_bytes), and a limit the caller gives. RLIMIT_MEMLOCK
// bounds what can be pinned, not what can be allocated: it is reported beside them.
//
// Contract: a plain value; read_host_memory() only reads files and limits, and is safe from any
// thread. A fact that cannot be read is std::nullopt.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace stowage {

struct HostMemoryFacts {
  std::uint64_t physical_bytes = 0;
  std::optional<std::uint64_t> available_bytes;    // MemAvailable
  std::optional<std::uint64_t> cgroup_room_bytes;  // the cgroup's limit less its usage
  std::optional<std::uint64_t> memlock_soft;       // RLIMIT_MEMLOCK; nullopt: unlimited
  std::optional<std::uint64_t> memlock_hard;
};

// What the process may still take, and which limit set it.
struct HostRoom {
  std::uint64_t available_bytes = 0;
  std::string limited_by;
  std::optional<std::uint64_t> lockable_bytes;  // RLIMIT_MEMLOCK's soft limit; nullopt: unlimited
};

// Reads the facts; `cgroup_root` is where cgroups are mounted (tests point it elsewhere).
HostMemoryFacts read_host_memory(const std::filesystem::path& cgroup_root = "/sys/fs/cgroup");

// The smallest of MemAvailable, the cgroup's room and `limit_bytes` (named "host_memory_limit"),
// or 2^62 bytes "nothing (no limit could be read)" when none is known.
HostRoom host_room(const HostMemoryFacts& facts, std::optional<std::uint64_t> limit_bytes);

}  // namespace stowage
