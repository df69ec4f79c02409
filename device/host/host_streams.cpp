#include "device/host/host_streams.hpp"

#include <chrono>
#include <optional>
#include <utility>
#include <vector>

#include "base/errors.hpp"
#include "base/log.hpp"

namespace stowage {

// One stream: an in-order task queue and, unless synchronous, the thread that drains it.
class HostStreamSet::Worker {
 public:
  explicit Worker(bool synchronous) : synchronous_(synchronous) { start(); }

  ~Worker() { stop(); }

  // Starts the thread that drains the queue (none in synchronous mode).
  void start() {
    if (synchronous_) return;
    std::lock_guard lock(mutex_);
    stopping_ = false;
    thread_ = std::thread([this] { run(); });
  }

  // Drains the queue and joins the thread.
  void stop() {
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
    if (synchronous_) {
      // Synchronous mode: one caller at a time, so the stream stays in order.
      std::lock_guard inline_lock(inline_mutex_);
      run_task(task);
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
    if (synchronous_) {
      // Synchronous mode: a task another thread is running inline finishes first.
      std::lock_guard inline_lock(inline_mutex_);
      return;
    }
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
      run_task(task);
      lock.lock();
      ++completed_;
      done_.notify_all();
    }
  }

  // Tasks must not throw (the contract); one that does is reported and dropped, the same way in
  // both modes and on CudaBackend, rather than terminating a worker thread.
  static void run_task(const std::function<void()>& task) noexcept {
    try {
      task();
    } catch (const std::exception& error) {
      log_warning(detail::concat("a task on a simulated stream threw; dropped: ", error.what()));
    } catch (...) {
      log_warning("a task on a simulated stream threw; dropped");
    }
  }

  const bool synchronous_;
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

// One recording of an event: the point in its stream's work that it captured.
struct HostStreamSet::Recording {
  std::mutex mutex;
  std::condition_variable done_changed;
  bool done = false;
  std::chrono::steady_clock::time_point completed_at;

  void complete() {
    {
      std::lock_guard lock(mutex);
      done = true;
      completed_at = std::chrono::steady_clock::now();
    }
    done_changed.notify_all();
  }
  bool is_done() {
    std::lock_guard lock(mutex);
    return done;
  }
  // When it completed; nullopt while it has not.
  std::optional<std::chrono::steady_clock::time_point> completion() {
    std::lock_guard lock(mutex);
    if (!done) return std::nullopt;
    return completed_at;
  }
  void wait() {
    std::unique_lock lock(mutex);
    done_changed.wait(lock, [&] { return done; });
  }
};

// An event is its latest published recording (Note [Host streams]); none: never recorded.
struct HostStreamSet::EventState {
  explicit EventState(bool timing_event) : timing(timing_event) {}

  const bool timing;
  std::mutex mutex;
  std::shared_ptr<Recording> latest;

  std::shared_ptr<Recording> current() {
    std::lock_guard lock(mutex);
    return latest;
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

Event HostStreamSet::create_event(bool timing) {
  std::lock_guard lock(mutex_);
  const std::uintptr_t id = next_event_++;
  events_.emplace(id, std::make_shared<EventState>(timing));
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
  auto recording = std::make_shared<Recording>();
  // Enqueue the completion first, publish the recording after: whoever sees a recording knows
  // its completion is already queued, so a wait on it can never sit in front of it.
  worker->enqueue([recording] { recording->complete(); });
  std::lock_guard lock(state->mutex);
  state->latest = std::move(recording);
}

bool HostStreamSet::query_event(Event event) {
  const auto recording = find_event(event)->current();
  return recording == nullptr || recording->is_done();
}

void HostStreamSet::synchronize_event(Event event) {
  const auto recording = find_event(event)->current();
  if (recording != nullptr) recording->wait();
}

void HostStreamSet::stream_wait_event(Stream stream, Event event) {
  const auto recording = find_event(event)->current();
  if (recording == nullptr) return;  // never recorded: nothing to wait for
  find_worker(stream)->enqueue([recording] { recording->wait(); });
}

double HostStreamSet::elapsed_seconds(Event start, Event end) {
  const auto completion = [&](Event event, const char* which) {
    const auto state = find_event(event);
    STOWAGE_CHECK(state->timing, "elapsed_seconds: the ", which,
                  " event was not created as a timing event");
    const auto recording = state->current();
    STOWAGE_CHECK(recording != nullptr, "elapsed_seconds: the ", which,
                  " event was never recorded");
    const auto at = recording->completion();
    STOWAGE_CHECK(at.has_value(), "elapsed_seconds: the ", which,
                  " event's recording has not completed");
    return *at;
  };
  const auto from = completion(start, "start");
  const auto to = completion(end, "end");
  return std::chrono::duration<double>(to - from).count();
}

void HostStreamSet::prepare_fork() {
  mutex_.lock();
  for (const auto& [id, worker] : workers_) worker->stop();
}

void HostStreamSet::after_fork() {
  for (const auto& [id, worker] : workers_) worker->start();
  mutex_.unlock();
}

}  // namespace stowage
