#include "allocator/host_streams.hpp"

#include <algorithm>
#include <utility>
#include <vector>

#include "allocator/errors.hpp"

namespace stowage {

// One stream: an in-order task queue and, unless synchronous, the thread that drains it.
class HostStreamSet::Worker {
 public:
  explicit Worker(bool synchronous) {
    if (!synchronous) thread_ = std::thread([this] { run(); });
  }

  ~Worker() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();  // the worker drains its queue before it exits
  }

  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  void enqueue(std::function<void()> task) {
    if (!thread_.joinable()) {
      // Synchronous mode: one caller at a time, so the stream stays in order.
      std::lock_guard inline_lock(inline_mutex_);
      task();
      return;
    }
    {
      std::lock_guard lock(mutex_);
      tasks_.push_back(std::move(task));
      ++enqueued_;
    }
    wake_.notify_one();
  }

  void synchronize() {
    std::unique_lock lock(mutex_);
    const std::uint64_t target = enqueued_;
    done_.wait(lock, [&] { return completed_ >= target; });
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, and everything enqueued has run
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      lock.lock();
      ++completed_;
      done_.notify_all();
    }
  }

  std::mutex mutex_;  // guards everything below but thread_
  std::condition_variable wake_;
  std::condition_variable done_;
  std::deque<std::function<void()>> tasks_;
  std::uint64_t enqueued_ = 0;
  std::uint64_t completed_ = 0;
  bool stopping_ = false;
  std::mutex inline_mutex_;
  std::thread thread_;
};

// One event: how many times it was recorded, and the latest recording that has completed.
struct HostStreamSet::EventState {
  std::mutex mutex;
  std::condition_variable completed_changed;
  std::uint64_t recorded = 0;
  std::uint64_t completed = 0;

  void complete(std::uint64_t recording) {
    {
      std::lock_guard lock(mutex);
      completed = std::max(completed, recording);
    }
    completed_changed.notify_all();
  }

  void wait_for(std::uint64_t recording) {
    std::unique_lock lock(mutex);
    completed_changed.wait(lock, [&] { return completed >= recording; });
  }
};

HostStreamSet::HostStreamSet(bool synchronous) : synchronous_(synchronous) {
  workers_.emplace(0, std::make_shared<Worker>(synchronous_));
}

HostStreamSet::~HostStreamSet() {
  std::map<std::uintptr_t, std::shared_ptr<Worker>> workers;
  {
    std::lock_guard lock(mutex_);
    workers.swap(workers_);
  }
  workers.clear();  // joins each worker after its queue drains
}

std::shared_ptr<HostStreamSet::Worker> HostStreamSet::find_worker(Stream stream) const {
  std::lock_guard lock(mutex_);
  const auto it = workers_.find(stream.handle);
  STOWAGE_CHECK(it != workers_.end(), "unknown stream ", stream.handle);
  return it->second;
}

std::shared_ptr<HostStreamSet::EventState> HostStreamSet::find_event(Event event) const {
  std::lock_guard lock(mutex_);
  const auto it = events_.find(event.handle);
  STOWAGE_CHECK(it != events_.end(), "unknown event ", event.handle);
  return it->second;
}

Stream HostStreamSet::create_stream() {
  auto worker = std::make_shared<Worker>(synchronous_);
  std::lock_guard lock(mutex_);
  const std::uintptr_t id = next_stream_++;
  workers_.emplace(id, std::move(worker));
  return Stream{id};
}

void HostStreamSet::destroy_stream(Stream stream) {
  STOWAGE_CHECK(stream.handle != 0, "the default stream cannot be destroyed");
  std::shared_ptr<Worker> worker;
  {
    std::lock_guard lock(mutex_);
    const auto it = workers_.find(stream.handle);
    STOWAGE_CHECK(it != workers_.end(), "destroy of unknown stream ", stream.handle);
    worker = std::move(it->second);
    workers_.erase(it);
  }
  worker->synchronize();
}

void HostStreamSet::synchronize_stream(Stream stream) { find_worker(stream)->synchronize(); }

void HostStreamSet::synchronize_all() {
  std::vector<std::shared_ptr<Worker>> workers;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [id, worker] : workers_) workers.push_back(worker);
  }
  for (const auto& worker : workers) worker->synchronize();
}

void HostStreamSet::enqueue(Stream stream, std::function<void()> task) {
  find_worker(stream)->enqueue(std::move(task));
}

Event HostStreamSet::create_event() {
  std::lock_guard lock(mutex_);
  const std::uintptr_t id = next_event_++;
  events_.emplace(id, std::make_shared<EventState>());
  return Event{id};
}

void HostStreamSet::destroy_event(Event event) {
  // A recording still in flight keeps the state alive through its task, as CUDA allows.
  std::lock_guard lock(mutex_);
  STOWAGE_CHECK(events_.erase(event.handle) == 1, "destroy of unknown event ", event.handle);
}

void HostStreamSet::record_event(Event event, Stream stream) {
  const auto state = find_event(event);
  const auto worker = find_worker(stream);
  std::uint64_t recording = 0;
  {
    std::lock_guard lock(state->mutex);
    recording = ++state->recorded;
  }
  worker->enqueue([state, recording] { state->complete(recording); });
}

bool HostStreamSet::query_event(Event event) {
  const auto state = find_event(event);
  std::lock_guard lock(state->mutex);
  return state->completed >= state->recorded;
}

void HostStreamSet::synchronize_event(Event event) {
  const auto state = find_event(event);
  std::uint64_t recording = 0;
  {
    std::lock_guard lock(state->mutex);
    recording = state->recorded;
  }
  state->wait_for(recording);
}

void HostStreamSet::stream_wait_event(Stream stream, Event event) {
  const auto state = find_event(event);
  const auto worker = find_worker(stream);
  std::uint64_t recording = 0;
  {
    std::lock_guard lock(state->mutex);
    recording = state->recorded;
  }
  worker->enqueue([state, recording] { state->wait_for(recording); });
}

std::size_t HostStreamSet::stream_count() const {
  std::lock_guard lock(mutex_);
  return workers_.size();
}

}  // namespace stowage
