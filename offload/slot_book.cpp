#include "offload/slot_book.hpp"

#include <algorithm>
#include <string>

#include "base/errors.hpp"

namespace stowage::offload {

UpdateMode parse_update_mode(std::string_view name) {
  if (name == "exact") return UpdateMode::kExact;
  if (name == "in_backward") return UpdateMode::kInBackward;
  STOWAGE_CHECK(name == "delayed", "update must be one of ('exact', 'in_backward', 'delayed'), not '",
                std::string(name), "'");
  return UpdateMode::kDelayed;
}

std::size_t SlotBook::add_bucket(std::size_t count) {
  STOWAGE_CHECK(count >= 1, "a bucket holds at least one parameter");
  Bucket bucket;
  bucket.first = slots_.size();
  bucket.size = count;
  buckets_.push_back(bucket);
  slots_.resize(slots_.size() + count, buckets_.size() - 1);
  versions_.resize(slots_.size());
  return buckets_.size() - 1;
}

void SlotBook::check_slot(std::size_t slot) const {
  STOWAGE_CHECK(slot < slots_.size(), "no offloaded parameter ", slot, " (there are ", slots_.size(), ")");
}

const SlotBook::Bucket& SlotBook::bucket_at(std::size_t bucket) const {
  STOWAGE_CHECK(bucket < buckets_.size(), "no bucket ", bucket, " (there are ", buckets_.size(), ")");
  return buckets_[bucket];
}

SlotBook::Bucket& SlotBook::bucket_at(std::size_t bucket) {
  STOWAGE_CHECK(bucket < buckets_.size(), "no bucket ", bucket, " (there are ", buckets_.size(), ")");
  return buckets_[bucket];
}

std::size_t SlotBook::bucket_of(std::size_t slot) const {
  check_slot(slot);
  return slots_[slot];
}

std::size_t SlotBook::first_slot(std::size_t bucket) const { return bucket_at(bucket).first; }
std::size_t SlotBook::size(std::size_t bucket) const { return bucket_at(bucket).size; }

bool SlotBook::arrive(std::size_t slot, std::int64_t version) {
  Bucket& bucket = bucket_at(bucket_of(slot));
  if (!versions_[slot].has_value()) ++bucket.arrived;
  versions_[slot] = version;
  return bucket.arrived == bucket.size;
}

void SlotBook::drop(std::size_t slot) {
  Bucket& bucket = bucket_at(bucket_of(slot));
  if (versions_[slot].has_value()) --bucket.arrived;
  versions_[slot].reset();
}

std::optional<std::int64_t> SlotBook::version(std::size_t slot) const {
  check_slot(slot);
  return versions_[slot];
}

std::size_t SlotBook::arrived_in(std::size_t bucket) const { return bucket_at(bucket).arrived; }

std::vector<bool> SlotBook::has_gradient(std::size_t bucket) const {
  const Bucket& b = bucket_at(bucket);
  std::vector<bool> flags;
  for (std::size_t slot = b.first; slot < b.first + b.size; ++slot) flags.push_back(versions_[slot].has_value());
  return flags;
}

void SlotBook::reset_arrivals() noexcept {
  for (Bucket& bucket : buckets_) bucket.arrived = 0;
  std::fill(versions_.begin(), versions_.end(), std::nullopt);
  parameters_checked_ = false;
}

std::vector<std::size_t> SlotBook::submitted(std::size_t bucket) {
  Bucket& b = bucket_at(bucket);
  STOWAGE_CHECK(!b.updated, "bucket ", bucket, " already has an update this step");
  b.updated_slots.clear();
  for (std::size_t slot = b.first; slot < b.first + b.size; ++slot) {
    if (versions_[slot].has_value()) b.updated_slots.push_back(slot);
  }
  b.updated = !b.updated_slots.empty();
  return b.updated_slots;
}

bool SlotBook::updated(std::size_t bucket) const { return bucket_at(bucket).updated; }

const std::vector<std::size_t>& SlotBook::updated_slots(std::size_t bucket) const {
  return bucket_at(bucket).updated_slots;
}

void SlotBook::clear_update(std::size_t bucket) {
  Bucket& b = bucket_at(bucket);
  b.updated = false;
  b.updated_slots.clear();
}

bool SlotBook::pending(std::size_t bucket) const {
  bucket_at(bucket);
  return std::find(pending_.begin(), pending_.end(), bucket) != pending_.end();
}

std::vector<std::size_t> SlotBook::provisional() const {
  std::vector<std::size_t> out;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b].updated && !pending(b)) out.push_back(b);
  }
  return out;
}

std::vector<std::size_t> SlotBook::slots_updated(bool updated) const {
  std::vector<std::size_t> out;
  for (std::size_t slot = 0; slot < slots_.size(); ++slot) {
    if (buckets_[slots_[slot]].updated == updated) out.push_back(slot);
  }
  return out;
}

const std::vector<std::size_t>& SlotBook::hold_pending() {
  STOWAGE_CHECK(mode_ == UpdateMode::kDelayed, "only delayed updates are held pending");
  pending_.clear();
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b].updated) pending_.push_back(b);
  }
  grad_buffer_ ^= 1;
  return pending_;
}

void SlotBook::end_step() noexcept {
  if (mode_ == UpdateMode::kInBackward) {
    for (Bucket& bucket : buckets_) {
      bucket.updated = false;
      bucket.updated_slots.clear();
    }
  }
  reset_arrivals();
}

void SlotBook::discard_step() noexcept {
  end_step();
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    if (!pending(b)) {
      buckets_[b].updated = false;
      buckets_[b].updated_slots.clear();
    }
  }
}

void SlotBook::check_invariants() const {
  STOWAGE_INTERNAL_ASSERT(versions_.size() == slots_.size());
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bucket = buckets_[b];
    std::size_t arrived = 0;
    for (std::size_t slot = bucket.first; slot < bucket.first + bucket.size; ++slot) {
      STOWAGE_INTERNAL_ASSERT(slots_[slot] == b, "slot ", slot);
      arrived += versions_[slot].has_value() ? 1U : 0U;
    }
    STOWAGE_INTERNAL_ASSERT(arrived == bucket.arrived, "bucket ", b);
    STOWAGE_INTERNAL_ASSERT(bucket.updated == !bucket.updated_slots.empty(), "bucket ", b);
    for (const std::size_t slot : bucket.updated_slots) {
      STOWAGE_INTERNAL_ASSERT(slots_[slot] == b, "bucket ", b, " slot ", slot);
    }
  }
  for (const std::size_t b : pending_) {
    STOWAGE_INTERNAL_ASSERT(b < buckets_.size() && buckets_[b].updated, "pending bucket ", b);
  }
  STOWAGE_INTERNAL_ASSERT(mode_ == UpdateMode::kDelayed || (pending_.empty() && grad_buffer_ == 0));
}

}  // namespace stowage::offload
