#include "device/host_memory_probe.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>
#include <system_error>
#include <utility>
#include <vector>

namespace stowage {

namespace {

std::optional<std::string> read_text(const std::filesystem::path& path) {
  std::ifstream file(path);
  if (!file) {
    return std::nullopt;
  }
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

// A file holding one unsigned number; nullopt for "max", an empty file or anything else.
std::optional<std::uint64_t> read_number(const std::filesystem::path& path) {
  const auto text = read_text(path);
  if (!text) {
    return std::nullopt;
  }
  const std::size_t begin = text->find_first_not_of(" \t\n");
  const std::size_t end = text->find_last_not_of(" \t\n");
  if (begin == std::string::npos) {
    return std::nullopt;
  }
  std::uint64_t value = 0;
  const char* first = text->data() + begin;
  const char* last = text->data() + end + 1;
  const auto [stop, error] = std::from_chars(first, last, value);
  if (error != std::errc{} || stop != last) {
    return std::nullopt;
  }
  return value;
}

std::optional<std::uint64_t> mem_available() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") {
      return kib * 1024;
    }
  }
  return std::nullopt;
}

// This process's v2 cgroup directory (the "0::" line of /proc/self/cgroup), if there is one.
std::optional<std::filesystem::path> own_cgroup(const std::filesystem::path& root) {
  std::ifstream groups("/proc/self/cgroup");
  std::string line;
  while (std::getline(groups, line)) {
    if (line.rfind("0::", 0) == 0) {
      return root / std::filesystem::path(line.substr(3)).relative_path();
    }
  }
  return std::nullopt;
}

std::optional<std::uint64_t> room(std::optional<std::uint64_t> limit, std::optional<std::uint64_t> usage) {
  if (!limit || !usage) {
    return std::nullopt;
  }
  return *limit > *usage ? *limit - *usage : 0;
}

std::optional<std::uint64_t> cgroup_room(const std::filesystem::path& root) {
  if (const auto group = own_cgroup(root)) {
    if (auto v2 = room(read_number(*group / "memory.max"), read_number(*group / "memory.current"))) {
      return v2;
    }
  }
  const auto limit = read_number(root / "memory" / "memory.limit_in_bytes");
  if (limit && *limit >= (std::uint64_t{1} << 60)) {
    return std::nullopt;  // v1 writes a huge number for "no limit"
  }
  return room(limit, read_number(root / "memory" / "memory.usage_in_bytes"));
}

std::optional<std::uint64_t> finite(rlim_t value) {
  return value == RLIM_INFINITY ? std::nullopt : std::optional<std::uint64_t>(value);
}

}  // namespace

HostMemoryFacts read_host_memory(const std::filesystem::path& cgroup_root) {
  HostMemoryFacts facts;
  const long page = sysconf(_SC_PAGE_SIZE);
  const long pages = sysconf(_SC_PHYS_PAGES);
  if (page > 0 && pages > 0) {
    facts.physical_bytes = static_cast<std::uint64_t>(page) * static_cast<std::uint64_t>(pages);
  }
  facts.available_bytes = mem_available();
  facts.cgroup_room_bytes = cgroup_room(cgroup_root);
  rlimit memlock{};
  if (getrlimit(RLIMIT_MEMLOCK, &memlock) == 0) {
    facts.memlock_soft = finite(memlock.rlim_cur);
    facts.memlock_hard = finite(memlock.rlim_max);
  }
  return facts;
}

HostRoom host_room(const HostMemoryFacts& facts, std::optional<std::uint64_t> limit_bytes) {
  std::vector<std::pair<std::uint64_t, std::string>> limits;
  if (facts.available_bytes) {
    limits.emplace_back(*facts.available_bytes, "available host memory (MemAvailable)");
  }
  if (facts.cgroup_room_bytes) {
    limits.emplace_back(*facts.cgroup_room_bytes, "the cgroup's memory limit");
  }
  if (limit_bytes) {
    limits.emplace_back(*limit_bytes, "host_memory_limit");
  }
  if (limits.empty()) {
    return {std::uint64_t{1} << 62, "nothing (no limit could be read)", facts.memlock_soft};
  }
  const auto smallest = std::min_element(limits.begin(), limits.end());
  return {smallest->first, smallest->second, facts.memlock_soft};
}

}  // namespace stowage
