// UpdateQueue: the offloaded optimizer's host updates, run one after another on a thread of its
// own, placed on the CPUs nearest the GPU.
//
// Jobs run in the order they are submitted: a bucket's update needs the previous step's update of
// the same bucket done, and submission order gives that. A job splits its work over the process's
// RangeWorkers (the AdamW kernel's threads); those threads are started by the first job that needs
// them, on this queue's thread, and inherit its CPU affinity (Linux gives a new thread its
// creator's mask), so placing this one thread places them all.
//
// Contract: thread-safe. submit() returns a ticket that completes when the job has returned; an
// exception the job throws is kept in the ticket and rethrown by take(). The destructor runs what
// was submitted before it returns. Jobs must not submit to their own queue and wait for it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace stowage::offload {

// The CPUs this process may use that are nearest the GPU with `pci_bus_id` (hwloc's view): all
// the allowed ones when the bus id is empty, unknown to hwloc, or shares no CPU with them.
std::vector<int> cpus_near(const std::string& pci_bus_id);

class UpdateTicket {
 public:
  // Whether the job has returned (or thrown). Never blocks.
  bool done() const noexcept { return done_.load(std::memory_order_acquire); }
  // After done(): rethrows what the job threw, once (later calls return).
  void take();

 private:
  friend class UpdateQueue;
  std::atomic<bool> done_ = false;
  std::exception_ptr error_;  // written before done_ is set
};

class UpdateQueue {
 public:
  // `cpus`: the CPUs the queue's thread runs on (empty: wherever the scheduler puts it).
  explicit UpdateQueue(std::vector<int> cpus);
  ~UpdateQueue();
  UpdateQueue(const UpdateQueue&) = delete;
  UpdateQueue& operator=(const UpdateQueue&) = delete;

  std::shared_ptr<UpdateTicket> submit(std::function<void()> job);

  const std::vector<int>& cpus() const noexcept { return cpus_; }
  // The threads a job splits its update over: one per CPU given (at least one).
  int threads() const noexcept { return cpus_.empty() ? 1 : static_cast<int>(cpus_.size()); }
  // Time spent in jobs so far.
  double busy_seconds() const noexcept { return static_cast<double>(busy_ns_.load()) * 1e-9; }

 private:
  void serve(const std::stop_token& stop);

  const std::vector<int> cpus_;
  std::mutex mutex_;  // guards jobs_
  std::condition_variable_any wake_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<UpdateTicket>>> jobs_;
  std::atomic<std::int64_t> busy_ns_ = 0;
  std::jthread thread_;  // last: started once the rest is built, joined first
};

}  // namespace stowage::offload
