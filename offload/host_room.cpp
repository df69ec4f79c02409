#include "offload/host_room.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

namespace stowage::offload {

namespace {

// The file's first number; nullopt when it cannot be read or says "max".
std::optional<std::int64_t> read_number(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return std::nullopt;
  try {
    return std::stoll(text);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<std::int64_t> mem_available(const std::string& meminfo) {
  std::ifstream in(meminfo);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    std::int64_t kib = 0;
    if (fields >> kib) return kib * 1024;
  }
  return std::nullopt;
}

// The cgroup's limit less its usage: v2 (the unified hierarchy's "0::" line), else v1.
std::optional<std::int64_t> cgroup_room(const HostRoomSources& sources) {
  std::ifstream in(sources.self_cgroup);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) != 0) continue;
    std::string path = line.substr(3);
    while (!path.empty() && path.front() == '/') path.erase(0, 1);
    const std::string group = sources.cgroup_root + "/" + path;
    const auto limit = read_number(group + "/memory.max");
    const auto usage = read_number(group + "/memory.current");
    if (limit && usage) return std::max<std::int64_t>(0, *limit - *usage);
    break;
  }
  const auto limit = read_number(sources.cgroup_root + "/memory/memory.limit_in_bytes");
  const auto usage = read_number(sources.cgroup_root + "/memory/memory.usage_in_bytes");
  if (limit && usage && *limit < (std::int64_t{1} << 60)) return std::max<std::int64_t>(0, *limit - *usage);
  return std::nullopt;
}

}  // namespace

HostRoom host_room(std::optional<std::int64_t> limit_bytes, const HostRoomSources& sources) {
  std::vector<std::pair<std::int64_t, std::string>> candidates;
  if (const auto available = mem_available(sources.meminfo)) {
    candidates.emplace_back(*available, "available host memory (MemAvailable)");
  }
  if (const auto cgroup = cgroup_room(sources)) candidates.emplace_back(*cgroup, "the cgroup's memory limit");
  if (limit_bytes) candidates.emplace_back(*limit_bytes, "host_memory_limit");
  HostRoom room;
  rlimit memlock{};
  if (getrlimit(RLIMIT_MEMLOCK, &memlock) == 0 && memlock.rlim_cur != RLIM_INFINITY) {
    room.lockable_bytes = static_cast<std::int64_t>(memlock.rlim_cur);
  }
  if (candidates.empty()) {
    room.available_bytes = std::int64_t{1} << 62;
    room.limited_by = "nothing (no limit could be read)";
    return room;
  }
  const auto smallest = std::min_element(candidates.begin(), candidates.end());
  room.available_bytes = smallest->first;
  room.limited_by = smallest->second;
  return room;
}

}  // namespace stowage::offload
