#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <latch>
#include <mutex>
#include <thread>
#include <vector>

namespace stowage::offload {

// Threads kept between calls that run the parts of one job beside the caller.
//
// Contract: run(parts, work) calls work(0) on the calling thread and work(1) .. work(parts - 1)
// on threads of the pool (started on first need, kept until destruction), and returns once all
// have returned. Calls from several threads are served one at a time. `work` must not throw.
// Why keep threads: a thread started per call begins on its creator's core and waits for the
// scheduler to move it, which on a small machine costs a memory-bound job a good part of a core.
class RangeWorkers {
 public:
  RangeWorkers() = default;
  RangeWorkers(const RangeWorkers&) = delete;
  RangeWorkers& operator=(const RangeWorkers&) = delete;
  ~RangeWorkers();

  void run(std::size_t parts, const std::function<void(std::size_t)>& work);

  // The pool the AdamW kernel shares across the process.
  static RangeWorkers& shared();

 private:
  void serve(std::size_t index, const std::stop_token& stop);

  std::mutex dispatch_;  // one job at a time
  std::mutex state_;     // guards the fields below
  std::condition_variable_any wake_;
  std::vector<std::jthread> threads_;
  const std::function<void(std::size_t)>* work_ = nullptr;
  std::size_t parts_ = 0;
  std::size_t generation_ = 0;
  std::latch* done_ = nullptr;
};

}  // namespace stowage::offload
