#include "offload/pending_step.hpp"

#include <utility>

#include "base/errors.hpp"

namespace stowage::offload {

PendingStep::PendingStep(std::size_t buckets, Work work)
    : landed_(buckets, false), arrivals_(buckets), thread_([this, work = std::move(work)] { run(work); }) {}

PendingStep::~PendingStep() {
  if (thread_.joinable()) thread_.join();
}

void PendingStep::run(const Work& work) {
  const Land land = [this](std::size_t bucket, Arrival arrival) {
    const std::lock_guard lock(mutex_);
    STOWAGE_CHECK(bucket < landed_.size(), "bucket ", bucket, " landed of ", landed_.size());
    landed_[bucket] = true;
    arrivals_[bucket] = std::move(arrival);
    changed_.notify_all();
  };
  std::exception_ptr error;
  try {
    work(land);
  } catch (...) {
    error = std::current_exception();
  }
  const std::lock_guard lock(mutex_);
  error_ = error;
  ended_ = true;
  changed_.notify_all();
}

std::exception_ptr PendingStep::take_error_locked() { return std::exchange(error_, nullptr); }

PendingStep::Arrival PendingStep::wait_landed(std::size_t bucket) {
  std::unique_lock lock(mutex_);
  STOWAGE_CHECK(bucket < landed_.size(), "a wait for bucket ", bucket, " of ", landed_.size());
  changed_.wait(lock, [&] { return landed_[bucket] || ended_; });
  if (ended_) {
    if (const std::exception_ptr error = take_error_locked()) std::rethrow_exception(error);
  }
  return arrivals_[bucket];
}

void PendingStep::finish() {
  {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return ended_; });
  }
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  const std::lock_guard lock(mutex_);
  if (const std::exception_ptr error = take_error_locked()) std::rethrow_exception(error);
}

bool PendingStep::ended() const {
  const std::lock_guard lock(mutex_);
  return ended_;
}

bool PendingStep::landed(std::size_t bucket) const {
  const std::lock_guard lock(mutex_);
  STOWAGE_CHECK(bucket < landed_.size(), "bucket ", bucket, " of ", landed_.size());
  return landed_[bucket];
}

}  // namespace stowage::offload
