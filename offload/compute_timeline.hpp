// ComputeTimeline: where the computation that produces and consumes offloaded tensors runs, as the
// offload engine needs to order its copies against it.
//
// On a GPU the compute is a device stream (DeviceStreamTimeline): an offload's copy waits for an
// event recorded on it, and a reload makes it wait for the copy's completion, so the host never
// blocks. In CPU mode the compute is the calling thread itself (HostThreadTimeline): an op has
// run before the next line of Python, so a copy has nothing to wait for, and a reload blocks the
// thread until the copy is done. That wait stands for the GPU's stream wait: the engine counts it
// as stall time, not as a synchronisation (synchronisations are the waits a GPU would block the
// host for too). Either way the moment the compute reaches the wait is recorded on a timing
// event, so how late or early each copy was is measured alike on both (Note [Prefetch window]).
//
// Contract: a timeline is a value the caller makes for each call (the compute stream may change
// between calls, as torch's current stream does); the backend must outlive it.
#pragma once

#include "base/bounded_wait.hpp"
#include "device/backend.hpp"

namespace stowage {

class ComputeTimeline {
 public:
  virtual ~ComputeTimeline() = default;
  // The stream device memory for the compute is allocated on.
  virtual Stream stream() const noexcept = 0;
  // Records on `event` the compute work so far, for a copy to wait for; false when that work has
  // already run, so there is nothing to wait for.
  virtual bool record(Event event) = 0;
  // Records on `arrival` (a timing event) the moment the compute reaches this point.
  virtual void mark(Event arrival) = 0;
  // Records on `arrival` (a timing event) the moment the compute reaches this point, then makes
  // the compute after it wait for `finished`; the time from one to the other is the stall (or,
  // negative, the slack). Where the host itself waits (CPU mode), it waits as Note [Bounded
  // waits] says, `what` naming the work and its bytes: it may throw WaitTimeout or Interrupted.
  virtual void wait(Event finished, Event arrival, const WaitFor& what) = 0;
};

class DeviceStreamTimeline final : public ComputeTimeline {
 public:
  DeviceStreamTimeline(DeviceBackend& backend, Stream stream) : backend_(backend), stream_(stream) {}

  Stream stream() const noexcept override { return stream_; }
  bool record(Event event) override {
    backend_.record_event(event, stream_);
    return true;
  }
  void mark(Event arrival) override { backend_.record_event(arrival, stream_); }
  void wait(Event finished, Event arrival, const WaitFor&) override {
    mark(arrival);
    backend_.stream_wait_event(stream_, finished);
  }

 private:
  DeviceBackend& backend_;
  Stream stream_;
};

class HostThreadTimeline final : public ComputeTimeline {
 public:
  explicit HostThreadTimeline(DeviceBackend& backend, const WaitLimits& waits = {})
      : backend_(backend), waits_(waits) {}

  Stream stream() const noexcept override { return Stream{}; }
  bool record(Event) override { return false; }
  // The arrival is recorded on the default stream, which CPU mode leaves idle: it completes
  // at once, stamped with the time the thread got here.
  void mark(Event arrival) override { backend_.record_event(arrival, Stream{}); }
  void wait(Event finished, Event arrival, const WaitFor& what) override {
    mark(arrival);
    wait_until([&] { return backend_.query_event(finished); }, what, waits_);
  }

 private:
  DeviceBackend& backend_;
  WaitLimits waits_;
};

}  // namespace stowage
