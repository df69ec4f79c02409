#include "allocator/oom_report.hpp"

#include <cctype>
#include <cstdio>
#include <sstream>

#include "allocator/base/byte_units.hpp"

namespace stowage {

void OomReport::describe() {
  fragmentation = reserved_unallocated == 0
                      ? 0.0
                      : 1.0 - static_cast<double>(largest_free_block) /
                                  static_cast<double>(reserved_unallocated);
  char percent[16];
  std::snprintf(percent, sizeof(percent), "%.1f%%", fragmentation * 100.0);

  std::ostringstream out;
  std::string holder = memory;
  if (!holder.empty()) holder[0] = static_cast<char>(std::toupper(holder[0]));
  out << "stowage: out of memory on " << memory << ": tried to allocate "
      << format_bytes(requested) << " (a block of " << format_bytes(rounded) << ") on stream 0x"
      << std::hex << stream.handle << std::dec << ". " << holder << ": "
      << format_bytes(device_total) << " total, " << format_bytes(device_free) << " free";
  if (limit < device_total) out << "; stowage's limit " << format_bytes(limit);
  out << ". stowage: " << format_bytes(allocated) << " allocated, " << format_bytes(reserved)
      << " reserved, of which " << format_bytes(reserved_unallocated)
      << " reserved but unallocated; largest free block " << format_bytes(largest_free_block)
      << "; fragmentation " << percent
      << " (1 - largest free block / reserved but unallocated).";
  if (rounded > device_total) {
    out << " The request is larger than all of " << memory << ".";
  } else if (device_free >= rounded && reserved <= limit && rounded <= limit - reserved) {
    out << " The memory reports room for it but refused (see the warnings logged before): a"
           " driver, address-space or mapping-limit failure, not a lack of memory.";
  } else if (largest_free_block < rounded && reserved_unallocated >= rounded) {
    out << " Enough memory is free but not in one piece: this is fragmentation.";
  } else if (const std::size_t free_anywhere = device_free + reserved_unallocated; free_anywhere >= rounded) {
    out << " The free bytes would hold it, split between " << memory << " (" << format_bytes(device_free)
        << ") and stowage's cache (" << format_bytes(reserved_unallocated)
        << "), neither enough alone: fragmentation across segments.";
  } else {
    // Not fragmentation: no arrangement of the free bytes holds the request
    out << " Live blocks hold the memory: the request is " << format_bytes(rounded - free_anywhere)
        << " more than every free byte together. Free tensors that are no longer needed, or offload"
           " or recompute activations.";
  }
  message = out.str();
}

}  // namespace stowage
