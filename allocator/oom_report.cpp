#include "allocator/oom_report.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <sstream>

#include "base/byte_units.hpp"

namespace stowage {

namespace {

std::string percent(double share) {
  char text[16];
  std::snprintf(text, sizeof(text), "%.1f%%", share * 100.0);
  return text;
}

// The torch-shaped opening: what ran out, the request, the capacity and what is free.
void write_torch_opening(const OomReport& r, std::ostringstream& out) {
  out << r.kind << " out of memory. Tried to allocate " << format_size_as_torch(r.requested) << ". "
      << r.holder << " has a total capacity of " << format_size_as_torch(r.device_total)
      << " of which " << format_size_as_torch(r.device_free) << " is free. ";
  if (r.limit < r.device_total) out << format_size_as_torch(r.limit) << " allowed; ";
  out << "Of the allocated memory " << format_size_as_torch(r.allocated) << " is in use, and "
      << format_size_as_torch(r.reserved_unallocated)
      << " is reserved by stowage but unallocated.";
}

// The holder as the middle of a sentence names it: "GPU 0", "the simulated device".
std::string in_sentence(std::string holder) {
  if (holder.size() > 1 && std::isupper(static_cast<unsigned char>(holder[0])) != 0 &&
      std::islower(static_cast<unsigned char>(holder[1])) != 0) {
    holder[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(holder[0])));
  }
  return holder;
}

// Note [OOM message]: the one cause that applies.
void write_cause(const OomReport& r, std::ostringstream& out) {
  const std::string holder = in_sentence(r.holder);
  const bool capped = r.limit < r.device_total;
  const std::size_t room = r.reserved < r.limit ? r.limit - r.reserved : 0;
  const bool device_has_room = r.device_free >= r.rounded;
  const bool cap_has_room = room >= r.rounded;
  const bool cache_has_room = r.reserved_unallocated >= r.rounded;
  if (capped) {
    out << " The cap is " << format_bytes(r.limit) << ", " << r.cap << "; "
        << format_bytes(r.reserved) << " of it is reserved, " << format_bytes(room) << " left.";
  }
  if (r.rounded > r.device_total) {
    out << " The request is larger than all of " << holder << ".";
  } else if (capped && r.rounded > r.limit) {
    out << " The request is larger than the cap: raise " << r.cap << ".";
  } else if (device_has_room && cap_has_room) {
    out << " The memory reports room for it but refused (see the warnings logged before): a"
           " driver, address-space or mapping-limit failure, not a lack of memory.";
  } else if (capped && device_has_room) {
    out << " The cap refused it: reserving " << format_bytes(r.rounded) << " more would pass it, while "
        << holder << " has " << format_bytes(r.device_free) << " free. Raise " << r.cap << ", or free tensors that are no longer needed, or offload"
           " or recompute activations.";
  } else if (cache_has_room) {
    out << " Enough memory is free but not in one piece: this is fragmentation. stowage's cache"
        << " has " << format_bytes(r.reserved_unallocated) << " free, but the largest free block"
        << " this request can use is " << format_bytes(r.largest_usable_block);
    if (r.largest_free_block > r.largest_usable_block) {
      out << " (a free block of " << format_bytes(r.largest_free_block)
          << " serves the other size class or another stream)";
    }
    out << "; fragmentation " << percent(r.fragmentation)
        << " (1 - that block / the cache's free bytes).";
  } else {
    const std::size_t growable = std::min(r.device_free, room);
    const std::size_t best = std::max(growable, r.reserved_unallocated);
    out << " Live blocks hold the memory: neither the free memory of " << holder << " ("
        << format_bytes(r.device_free);
    if (capped) out << ", " << format_bytes(room) << " of it under the cap";
    out << ") nor stowage's cache (" << format_bytes(r.reserved_unallocated)
        << " free) holds it alone; the request is " << format_bytes(r.rounded - best)
        << " more than the larger. Free tensors that are no longer needed, or offload or recompute"
           " activations.";
  }
}

}  // namespace

std::string format_size_as_torch(std::size_t bytes) {
  char text[64];
  const auto value = static_cast<double>(bytes);
  if (bytes <= kKiB) {
    std::snprintf(text, sizeof(text), "%zu bytes", bytes);
  } else if (bytes <= kMiB) {
    std::snprintf(text, sizeof(text), "%.2f KiB", value / static_cast<double>(kKiB));
  } else if (bytes <= kGiB) {
    std::snprintf(text, sizeof(text), "%.2f MiB", value / static_cast<double>(kMiB));
  } else {
    std::snprintf(text, sizeof(text), "%.2f GiB", value / static_cast<double>(kGiB));
  }
  return text;
}

void OomReport::describe() {
  fragmentation = reserved_unallocated == 0
                      ? 0.0
                      : 1.0 - static_cast<double>(std::min(largest_usable_block, reserved_unallocated)) /
                                  static_cast<double>(reserved_unallocated);
  std::ostringstream out;
  write_torch_opening(*this, out);
  out << " stowage:";
  write_cause(*this, out);
  out << " (The request: " << format_bytes(requested) << ", a block of " << format_bytes(rounded)
      << " on stream 0x" << std::hex << stream.handle << std::dec << ".)";
  message = out.str();
}

}  // namespace stowage
