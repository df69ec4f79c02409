// host_room: what host memory the process may really take, read before the offloaded optimizer
// takes any.
//
// Three limits apply, and the smallest wins: the memory the kernel says is available
// (MemAvailable), the cgroup's limit less what the cgroup already uses (v2 memory.max, or v1
// memory.limit_in_bytes), and a limit the caller gives (host_memory_limit=, also how tests
// simulate a small host). Pinning has one more, RLIMIT_MEMLOCK: beyond it the host refuses to lock
// pages, and the pool falls back to pageable memory with one warning, so it bounds how much is
// pinned, not what can be allocated.
//
// Contract: reads files and limits each call; never throws for a file it cannot read (that limit
// is then not known).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace stowage::offload {

// Where the limits are read; tests point them at files of their own.
struct HostRoomSources {
  std::string meminfo = "/proc/meminfo";
  std::string self_cgroup = "/proc/self/cgroup";
  std::string cgroup_root = "/sys/fs/cgroup";
};

struct HostRoom {
  std::int64_t available_bytes = 0;
  std::string limited_by;  // which limit set available_bytes
  std::optional<std::int64_t> lockable_bytes;  // RLIMIT_MEMLOCK; nullopt: unlimited
};

// The host memory this process may still take; `limit_bytes` caps it further.
[[nodiscard]] HostRoom host_room(std::optional<std::int64_t> limit_bytes, const HostRoomSources& sources = {});

}  // namespace stowage::offload
