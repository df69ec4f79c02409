#include "offload/update_queue.hpp"

#include <pthread.h>
#include <sched.h>

#include <chrono>

namespace stowage::offload {

namespace {

// Binds the calling thread to `cpus`; a cpuset that changed since leaves it where it is.
void place_on(const std::vector<int>& cpus) {
  if (cpus.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (const int cpu : cpus) {
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(static_cast<std::size_t>(cpu), &set);
  }
  (void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

}  // namespace

void UpdateTicket::take() {
  if (error_ == nullptr) return;
  const std::exception_ptr error = std::exchange(error_, nullptr);
  std::rethrow_exception(error);
}

UpdateQueue::UpdateQueue(std::vector<int> cpus)
    : cpus_(std::move(cpus)), thread_([this](const std::stop_token& stop) { serve(stop); }) {}

UpdateQueue::~UpdateQueue() {
  thread_.request_stop();
  wake_.notify_all();
  thread_.join();  // serve() drains the queue before it returns
}

std::shared_ptr<UpdateTicket> UpdateQueue::submit(std::function<void()> job) {
  auto ticket = std::make_shared<UpdateTicket>();
  {
    std::scoped_lock lock(mutex_);
    jobs_.emplace_back(std::move(job), ticket);
  }
  wake_.notify_one();
  return ticket;
}

void UpdateQueue::serve(const std::stop_token& stop) {
  place_on(cpus_);
  while (true) {
    std::pair<std::function<void()>, std::shared_ptr<UpdateTicket>> next;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, stop, [&] { return !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopped, nothing left
      next = std::move(jobs_.front());
      jobs_.pop_front();
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      next.first();
    } catch (...) {
      next.second->error_ = std::current_exception();
    }
    busy_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
    next.first = nullptr;  // what the job held goes before the ticket says it is done
    next.second->done_.store(true, std::memory_order_release);
  }
}

}  // namespace stowage::offload
