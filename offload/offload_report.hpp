// OffloadReport: what one activation-offload region did, in bytes (each storage counted once), as
// stowage.offload.activations() hands it out; README's "Offloading activations" says what each
// figure means to its user.
//
// saved .. held_elsewhere: the region's offloader's counts; held_elsewhere_bytes: offloaded
// storages still referenced as the region ended, kept on the device from then on. forward_bytes:
// what the forward left allocated on the device, counting offloaded storages as if still there
// (read from the allocator at the region's start and end, the region's own once the step before
// it has ended, plus what offloading freed: the offloaded bytes no longer alive); unseen_bytes:
// the part of it no saved tensor held (ctx attributes, outputs, caches).
//
// Contract: a value; not thread-safe.
#pragma once

#include <cstdint>
#include <string>

namespace stowage::offload {

struct OffloadReport {
  std::int64_t saved_bytes = 0;
  std::int64_t offloaded_bytes = 0;
  std::int64_t parameter_bytes = 0;
  std::int64_t small_bytes = 0;
  std::int64_t elsewhere_bytes = 0;
  std::int64_t host_full_bytes = 0;
  std::int64_t num_saved = 0;
  std::int64_t num_shared = 0;
  std::int64_t forward_bytes = 0;
  std::int64_t unseen_bytes = 0;
  std::int64_t held_elsewhere_bytes = 0;

  // forward_bytes and unseen_bytes from the device's allocated bytes at the region's start and
  // end and the offloaded bytes still alive at its end (the counts already filled in).
  void account_forward(std::int64_t allocated_before, std::int64_t allocated_after,
                       std::int64_t live_offloaded_bytes);
  // The report as lines of text, for the user.
  std::string text() const;

  bool operator==(const OffloadReport&) const = default;
};

}  // namespace stowage::offload
