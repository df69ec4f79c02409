// SavedStorage: one offloaded storage as the saved tensors over it see it, for backward.
//
// Note [Saved tensors written through an alias]
// torch's saved tensor aliases its storage: backward reads the bytes as they are when it runs. A
// write that bumps no version (p.data.mul_(), a tensor from .data or .detach() kept by a forward
// hook, numpy's view of a CPU tensor) changes what backward reads, and torch lets it. An offloaded
// tensor's host copy holds the bytes as they were when copied, so stowage reads a saved storage
// from its copy only where no one could have written it since:
//   - at unpack, a storage still alive (held by anyone) is read in place, as torch reads it; it is
//     kept from then on for the saved tensors still to come back over it, and its copy (with any
//     buffer brought back ahead of use) let go;
//   - when the offload region ends (stowage.offload.activations' `with` block; a plan's, after
//     its backward, finds nothing left), each storage someone besides the offloader still holds
//     and backward has not read is kept by stowage from then on, its host copy let go: a holder
//     that writes it after the region and lets go of it before backward is seen too. Memory is
//     what torch's own saved tensor holds there;
//   - a storage let go of by everyone before then comes back from its copy. A write through an
//     alias between the copy and that moment is the one write this misses: inside an
//     activations region, a write during forward; inside a plan's, which spans backward, also a
//     write after forward by a holder that lets go before backward. Check mode finds both: it
//     keeps (watch_if_held_elsewhere) each storage someone else holds when the model's forward
//     returns, and before backward reads the copy of one let go of since, it compares the bytes
//     the storage held when let go with those saved (TensorOffloader::unpack); a write before
//     the copy read the bytes shows as a copy that came back changed.
//
// Contract: made by pack on the step's thread; read() from autograd's threads; the *_if_held_elsewhere
// calls on the step's thread, with no backward running. Internally locked.
#pragma once

#include <c10/core/Storage.h>
#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>

#include "offload/offload_engine.hpp"

namespace stowage::torch_offload {

// A buffer and the engine holding it; dropped when the last holder goes.
class OffloadRef {
 public:
  OffloadRef(OffloadEngine& engine, Offloader::OffloadId id) : engine_(engine), id_(id) {}
  ~OffloadRef() { engine_.offloader().drop(id_); }
  OffloadRef(const OffloadRef&) = delete;
  OffloadRef& operator=(const OffloadRef&) = delete;

  OffloadEngine& engine() const noexcept { return engine_; }
  Offloader::OffloadId id() const noexcept { return id_; }

 private:
  OffloadEngine& engine_;
  Offloader::OffloadId id_;
};

class SavedStorage {
 public:
  // What backward reads: the storage in place, or its copy (`let_go`: in check mode, the storage
  // as its last holder left it, to compare with what was saved before the copy is used).
  // `copy_dropped`: the copy a read in place let go of, for the caller to count and drop.
  struct Reading {
    std::optional<c10::Storage> in_place;
    std::optional<c10::Storage> let_go;
    std::shared_ptr<OffloadRef> copy_dropped;
  };

  explicit SavedStorage(const c10::Storage& storage);

  // What the offloader holds of the storage while its copy runs (DeviceBuffer::owner): a
  // c10::Storage whose release this SavedStorage hears of.
  std::shared_ptr<void> owner_for_copy(const c10::Storage& storage) const;
  void set_ref(std::shared_ptr<OffloadRef> ref);
  // The host copy's buffer; null once the storage is kept (its copy let go).
  std::shared_ptr<OffloadRef> ref() const;

  // Backward reads it: in place where anyone but check mode's watch holds it (kept from then on,
  // its copy let go), else from its copy.
  Reading read();
  // The region ended: keeps the storage when someone besides stowage holds it and backward has not
  // read it, letting go of its copy. Its bytes when it did, else 0.
  std::size_t keep_if_held_elsewhere();
  // Check mode, the model's forward returned: holds the storage when someone besides stowage holds
  // it, for read() to compare once they let go.
  void watch_if_held_elsewhere();
  bool alive() const { return !weak_.expired(); }

 private:
  // References to `storage` besides `ours` (one), the offloader's and check mode's watch.
  std::int64_t held_elsewhere_locked(const c10::intrusive_ptr<c10::StorageImpl>& storage) const;

  mutable std::mutex mutex_;  // guards the members below but released_
  c10::weak_intrusive_ptr<c10::StorageImpl> weak_;
  std::optional<c10::Storage> kept_;
  std::optional<c10::Storage> watched_;
  std::shared_ptr<OffloadRef> ref_;
  bool used_ = false;  // backward read it
  // Set when the offloader lets go of its reference (its copy completed, or it was dropped).
  std::shared_ptr<std::atomic<bool>> released_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace stowage::torch_offload
