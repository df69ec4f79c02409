#include "offload/range_workers.hpp"

namespace stowage::offload {

RangeWorkers::~RangeWorkers() {
  for (auto& thread : threads_) thread.request_stop();
  wake_.notify_all();
  threads_.clear();  // joins
}

RangeWorkers& RangeWorkers::shared() {
  static RangeWorkers workers;
  return workers;
}

void RangeWorkers::run(std::size_t parts, const std::function<void(std::size_t)>& work) {
  if (parts <= 1) {
    if (parts == 1) work(0);
    return;
  }
  std::scoped_lock dispatch(dispatch_);
  std::latch done(static_cast<std::ptrdiff_t>(parts - 1));
  {
    std::scoped_lock lock(state_);
    while (threads_.size() < parts - 1) {
      const std::size_t index = threads_.size() + 1;
      threads_.emplace_back([this, index](const std::stop_token& stop) { serve(index, stop); });
    }
    work_ = &work;
    parts_ = parts;
    done_ = &done;
    ++generation_;
  }
  wake_.notify_all();
  work(0);
  done.wait();
}

void RangeWorkers::serve(std::size_t index, const std::stop_token& stop) {
  std::size_t seen = 0;
  {
    std::scoped_lock lock(state_);
    seen = generation_ - 1;  // started for the job now being dispatched
  }
  while (true) {
    const std::function<void(std::size_t)>* work = nullptr;
    std::latch* done = nullptr;
    {
      std::unique_lock lock(state_);
      if (!wake_.wait(lock, stop, [&] { return generation_ != seen; })) return;
      seen = generation_;
      if (index >= parts_) continue;  // a job with fewer parts than there are threads
      work = work_;
      done = done_;
    }
    (*work)(index);
    done->count_down();
  }
}

}  // namespace stowage::offload
