#include "snapshot/memory_budget.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>

#include "snapshot/limits.hpp"
#include "snapshot/refusal.hpp"

namespace stowage::snapshot {

std::optional<std::uint64_t> resident_bytes() {
  const int file = ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (file < 0) return std::nullopt;
  char text[128];
  const ssize_t count = ::read(file, text, sizeof(text) - 1);
  ::close(file);
  if (count <= 0) return std::nullopt;
  text[count] = '\0';
  char* end = nullptr;
  std::strtoull(text, &end, 10);  // the total program size, then the resident set
  const unsigned long long pages = std::strtoull(end, &end, 10);
  const long page_size = ::sysconf(_SC_PAGESIZE);
  if (page_size <= 0) return std::nullopt;
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page_size);
}

MemoryBudget::MemoryBudget(std::uint64_t pickle_size, std::uint64_t per_byte, std::optional<std::uint64_t> start)
    : start_(start ? start : resident_bytes()), per_byte_(per_byte), budget_(kMemoryFloor + per_byte * pickle_size) {}

void MemoryBudget::check(std::uint64_t position, std::uint64_t planned) const {
  if (!start_) return;
  const std::optional<std::uint64_t> now = resident_bytes();
  if (!now) return;
  const std::uint64_t grown = *now > *start_ ? *now - *start_ : 0;
  if (grown <= budget_ && planned <= budget_ - grown) return;
  SNAPSHOT_REFUSE("reading it grew memory by more than ", with_commas(budget_ >> 20), " MiB by byte ",
                  with_commas(position), " (", kMemoryFloor >> 20, " MiB and ", per_byte_,
                  " bytes a byte of pickle): refused, as no snapshot read into columns builds that "
                  "much (a file of one repeated opcode does; read as plain data, a dict per trace "
                  "event, a large snapshot does too: load_snapshot_columnar reads it, as stowage "
                  "inspect does)");
}

}  // namespace stowage::snapshot
