// Streams and events of the simulated device (Note [Host streams]).
//
// Note [Host streams]
// Each stream is an in-order queue of tasks run by a worker thread of its own, so work on two
// streams really overlaps and stream-ordering bugs show up as they would on a GPU. Each
// record_event makes a new recording, enqueues the task that completes it, and only then
// publishes it as the event's latest; query, synchronize and stream_wait_event act on the
// recording that was latest when they were called (as in CUDA, recording the event again later
// does not change what an earlier wait waits for). stream_wait_event blocks the waiting stream's
// worker until that recording completes. A never-recorded event is complete. A task that throws
// is reported and dropped.
//
// Synchronous mode (for replay and deterministic tests) runs every task inline, on the caller's
// thread, before enqueue returns; no threads are started. Timing events keep the time each
// recording completed, as CUDA events without cudaEventDisableTiming do.
//
// Contract: thread-safe. Owns its worker threads; destroying a stream, or the set, first runs
// every task already enqueued. Tasks must not throw and must not enqueue onto the stream that is
// running them and then wait for it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "device/backend.hpp"

namespace stowage {

class HostStreamSet {
 public:
  explicit HostStreamSet(bool synchronous);
  ~HostStreamSet();
  HostStreamSet(const HostStreamSet&) = delete;
  HostStreamSet& operator=(const HostStreamSet&) = delete;

  bool synchronous() const noexcept { return synchronous_; }

  Stream create_stream();
  void destroy_stream(Stream stream);
  void synchronize_stream(Stream stream);
  void synchronize_all();
  // Enqueues `task` on `stream`; in synchronous mode runs it before returning.
  void enqueue(Stream stream, std::function<void()> task);

  // A timing event's recordings keep the time they completed (elapsed_seconds).
  Event create_event(bool timing = false);
  void destroy_event(Event event);
  void record_event(Event event, Stream stream);
  bool query_event(Event event);
  void synchronize_event(Event event);
  void stream_wait_event(Stream stream, Event event);
  double elapsed_seconds(Event start, Event end);

  // For fork(): prepare_fork() runs every stream's work to the end, stops the worker threads
  // and holds the set's lock; after_fork() releases it and starts the threads again (in the
  // child, threads of its own: fork() copies only the calling thread).
  void prepare_fork();
  void after_fork();

 private:
  class Worker;
  struct Recording;
  struct EventState;

  // Looked-up objects are shared so a concurrent destroy cannot free one under a caller.
  std::shared_ptr<Worker> find_worker(Stream stream) const;
  std::shared_ptr<EventState> find_event(Event event) const;

  const bool synchronous_;
  mutable std::mutex mutex_;  // guards the two tables and the id counters
  std::map<std::uintptr_t, std::shared_ptr<Worker>> workers_;
  std::map<std::uintptr_t, std::shared_ptr<EventState>> events_;
  std::uintptr_t next_stream_ = 1;
  std::uintptr_t next_event_ = 1;
};

}  // namespace stowage
