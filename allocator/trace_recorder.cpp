#include "allocator/trace_recorder.hpp"

#include <exception>
#include <utility>

#include "base/errors.hpp"
#include "base/log.hpp"

namespace stowage {

void TraceRecorder::add_listener(Listener listener) {
  STOWAGE_CHECK(static_cast<bool>(listener), "add_trace_listener needs a function");
  listeners_.push_back(std::move(listener));
}

void TraceRecorder::dispatch(const TraceEntry& entry) {
  for (const Listener& listener : listeners_) {
    try {
      listener(entry);
    } catch (const std::exception& error) {
      log_warning(detail::concat("a trace listener threw: ", error.what()));
    }
  }
  history_.record(entry);
}

}  // namespace stowage
