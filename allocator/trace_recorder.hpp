// Where an allocator's events go: its History (when recording) and its trace listeners.
//
// An event recorded with no context of its own (0: a segment freed or unmapped) takes the context
// of the call that caused it, set by a ContextScope around that call: memory_viz shows the stack
// of the empty_cache or the allocation that gave a segment back, as torch's allocator records it.
//
// record() builds an event only when someone listens (active()), so an allocator that records
// nothing pays one predictable branch per event. Listeners hear every event as it happens, under
// the owner's lock: they must not call the allocator. A listener that throws is logged and kept.
//
// Contract: not thread-safe (the owner's lock guards it); owns the history and the listeners.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "allocator/history.hpp"
#include "device/backend.hpp"

namespace stowage {

class TraceRecorder {
 public:
  using Listener = std::function<void(const TraceEntry&)>;

  bool active() const noexcept { return history_.enabled() || !listeners_.empty(); }
  void record(TraceAction action, std::uintptr_t address, std::size_t size, Stream stream,
              std::uint64_t context) {
    if (!active()) return;
    dispatch({action, address, size, stream, History::now_us(), context != 0 ? context : caller_context_});
  }

  // The caller's context for the events recorded while it lives (restoring the one before).
  class ContextScope {
   public:
    ContextScope(TraceRecorder& recorder, std::uint64_t context) noexcept
        : recorder_(recorder), before_(recorder.caller_context_) {
      recorder_.caller_context_ = context;
    }
    ~ContextScope() { recorder_.caller_context_ = before_; }
    ContextScope(const ContextScope&) = delete;
    ContextScope& operator=(const ContextScope&) = delete;

   private:
    TraceRecorder& recorder_;
    std::uint64_t before_;
  };
  // Throws LogicError for an empty function.
  void add_listener(Listener listener);

  History& history() noexcept { return history_; }
  const History& history() const noexcept { return history_; }

 private:
  void dispatch(const TraceEntry& entry);

  History history_;
  std::vector<Listener> listeners_;
  std::uint64_t caller_context_ = 0;
};

}  // namespace stowage
