#include "python/tensors/saved_storage.hpp"

#include <utility>

namespace stowage::torch_offload {

SavedStorage::SavedStorage(const c10::Storage& storage) : weak_(storage.getWeakStorageImpl()) {}

std::shared_ptr<void> SavedStorage::owner_for_copy(const c10::Storage& storage) const {
  // Marked before the reference goes (see held_elsewhere_locked); wherever the offloader lets go,
  // noexcept paths among them: nothing else here.
  return std::shared_ptr<c10::Storage>(new c10::Storage(storage), [released = released_](c10::Storage* held) {
    released->store(true, std::memory_order_seq_cst);
    delete held;
  });
}

void SavedStorage::set_ref(std::shared_ptr<OffloadRef> ref) {
  std::lock_guard lock(mutex_);
  ref_ = std::move(ref);
}

std::shared_ptr<OffloadRef> SavedStorage::ref() const {
  std::lock_guard lock(mutex_);
  return ref_;
}

std::int64_t SavedStorage::held_elsewhere_locked(const c10::intrusive_ptr<c10::StorageImpl>& storage) const {
  // The count first, then the mark (set before the offloader's reference goes): a release between
  // the two can make the offloader's reference count as someone else's, never the other way, so
  // a storage someone holds is never taken for one nobody does.
  const auto count = static_cast<std::int64_t>(storage.use_count());
  const bool offloader_holds = !released_->load(std::memory_order_seq_cst);
  return count - 1 - (offloader_holds ? 1 : 0) - (watched_.has_value() ? 1 : 0);
}

SavedStorage::Reading SavedStorage::read() {
  std::optional<c10::Storage> watched;  // let go after the lock (declared before it)
  std::lock_guard lock(mutex_);
  used_ = true;
  if (kept_.has_value()) return {kept_, std::nullopt, nullptr};
  c10::intrusive_ptr<c10::StorageImpl> alive = weak_.lock();
  if (!alive) return {};
  watched = std::move(watched_);  // read once; later reads see what is left
  watched_.reset();
  // Without check mode's watch, would the storage be alive? (Anyone's reference counts, the
  // offloader's too: it holds the buffer only while nobody could have written it since.)
  const auto others = static_cast<std::int64_t>(alive.use_count()) - 1 - (watched.has_value() ? 1 : 0);
  if (others <= 0 && watched.has_value()) return {std::nullopt, std::move(watched), nullptr};
  // Read in place: kept from now on, as torch's saved tensor keeps it for the views still to come
  // back, and the copy let go (a buffer brought back ahead of use with it).
  kept_ = c10::Storage(std::move(alive));
  return {kept_, std::nullopt, std::move(ref_)};
}

std::size_t SavedStorage::keep_if_held_elsewhere() {
  std::shared_ptr<OffloadRef> dropped;  // let go after the lock: dropping parks or frees device memory
  std::optional<c10::Storage> unwatched;
  std::lock_guard lock(mutex_);
  if (kept_.has_value() || used_ || ref_ == nullptr) return 0;
  c10::intrusive_ptr<c10::StorageImpl> alive = weak_.lock();
  if (!alive || held_elsewhere_locked(alive) <= 0) return 0;
  kept_ = c10::Storage(std::move(alive));
  dropped = std::move(ref_);
  unwatched = std::move(watched_);
  watched_.reset();
  return kept_->nbytes();
}

void SavedStorage::watch_if_held_elsewhere() {
  std::lock_guard lock(mutex_);
  if (kept_.has_value() || watched_.has_value() || used_) return;
  c10::intrusive_ptr<c10::StorageImpl> alive = weak_.lock();
  if (alive && held_elsewhere_locked(alive) > 0) watched_ = c10::Storage(std::move(alive));
}

}  // namespace stowage::torch_offload
