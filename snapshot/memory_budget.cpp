#include "snapshot/memory_budget.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <utility>

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

namespace {

// min(kMemoryFloor + per_byte * size, ceiling), without overflow (a size near 2**64 does not wrap
// to a small budget).
std::uint64_t budget_of(std::uint64_t size, const MemoryBound& bound) {
  if (bound.ceiling <= kMemoryFloor) return bound.ceiling;
  const std::uint64_t room = bound.ceiling - kMemoryFloor;  // what the share may add
  if (bound.per_byte != 0 && size > room / bound.per_byte) return bound.ceiling;
  return kMemoryFloor + bound.per_byte * size;
}

}  // namespace

MemoryBudget::MemoryBudget(std::uint64_t pickle_size, MemoryBound bound, std::optional<std::uint64_t> start)
    : start_(start ? start : resident_bytes()), bound_(std::move(bound)), budget_(budget_of(pickle_size, bound_)) {}

void MemoryBudget::check(std::uint64_t position, std::uint64_t planned) const {
  if (!start_) return;
  const std::optional<std::uint64_t> now = resident_bytes();
  if (!now) return;
  const std::uint64_t grown = *now > *start_ ? *now - *start_ : 0;
  if (grown <= budget_ && planned <= budget_ - grown) return;
  SNAPSHOT_REFUSE("reading it grew memory by more than ", with_commas(budget_ >> 20), " MiB by byte ",
                  with_commas(position), " (its budget: ", kMemoryFloor >> 20, " MiB and ", bound_.per_byte,
                  " bytes a byte of pickle, at most ", with_commas(bound_.ceiling >> 20), " MiB): refused",
                  bound_.remedy.empty() ? "" : "; ", bound_.remedy);
}

std::string columns_remedy(std::uint64_t pickle_size, const std::string& command) {
  // ceil((kMemoryFloor + kColumnsMemoryPerByte * pickle_size) / 1 GiB), a pickle's whole GiB apart: no wrap
  const std::uint64_t whole = pickle_size >> 30, rest = pickle_size & ((std::uint64_t{1} << 30) - 1);
  const std::uint64_t gib = std::max<std::uint64_t>(
      2, kColumnsMemoryPerByte * whole + ((kMemoryFloor + kColumnsMemoryPerByte * rest + (std::uint64_t{1} << 30) - 1) >> 30));
  std::string out = "a trace whose events carry stack frames of their own takes up to ";
  out.append(std::to_string(kColumnsMemoryPerByte))
      .append(" bytes a byte read into columns, and no snapshot more (a file of one repeated opcode does); to read a "
              "larger one, raise the ceiling: ")
      .append(kCeilingVariable)
      .append("=")
      .append(std::to_string(gib))
      .append("GiB")
      .append(command.empty() ? std::string(" in the environment of the program that reads it") : " " + command);
  return out.append("; or record fewer frames (torch.cuda.memory._record_memory_history(stacks=\"python\"), or a "
                    "smaller max_entries)");
}

}  // namespace stowage::snapshot
