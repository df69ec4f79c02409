#include "offload/offload_report.hpp"

#include <algorithm>

#include "base/byte_units.hpp"

namespace stowage::offload {

namespace {

std::string bytes(std::int64_t count) { return format_bytes(static_cast<std::size_t>(std::max<std::int64_t>(count, 0))); }

}  // namespace

void OffloadReport::account_forward(std::int64_t allocated_before, std::int64_t allocated_after,
                                    std::int64_t live_offloaded_bytes) {
  const std::int64_t freed_by_offloading = offloaded_bytes - live_offloaded_bytes;
  forward_bytes = std::max<std::int64_t>(0, allocated_after - allocated_before + freed_by_offloading);
  const std::int64_t activations_saved = saved_bytes - parameter_bytes - elsewhere_bytes;
  unseen_bytes = std::max<std::int64_t>(0, forward_bytes - activations_saved);
}

std::string OffloadReport::text() const {
  std::string out = "offload: " + std::to_string(num_saved) + " saved tensors, " + bytes(saved_bytes) +
                    " in distinct storages\n  offloaded       " + bytes(offloaded_bytes) + "\n";
  if (held_elsewhere_bytes != 0) {
    out += "    of which " + bytes(held_elsewhere_bytes) + " still referenced as the region ended (kept, read in place)\n";
  }
  out += "  parameters      " + bytes(parameter_bytes) + " (never offloaded)\n  kept            " +
         bytes(saved_bytes - offloaded_bytes - parameter_bytes) + " (small " + bytes(small_bytes) + ", no host memory " +
         bytes(host_full_bytes) + ", not stowage's memory " + bytes(elsewhere_bytes) + ")\n  forward left    " +
         bytes(forward_bytes) + " allocated, of which " + bytes(unseen_bytes) + " held outside saved tensors";
  return out;
}

}  // namespace stowage::offload
