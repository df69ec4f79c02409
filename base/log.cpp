#include "base/log.hpp"

#include <cstdio>
#include <mutex>
#include <string>

namespace stowage {

namespace {

std::mutex& sink_mutex() {
  static std::mutex mutex;
  return mutex;
}

LogSink& current_sink() {
  static LogSink sink;
  return sink;
}

}  // namespace

void log_warning(std::string_view message) noexcept {
  try {
    const std::string line = "stowage: warning: " + std::string(message);
    std::lock_guard lock(sink_mutex());
    if (current_sink()) {
      current_sink()(line);
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  } catch (...) {
    // Logging must never turn a noexcept path into a crash; the line is lost.
  }
}

LogSink set_log_sink(LogSink sink) {
  std::lock_guard lock(sink_mutex());
  LogSink previous = std::move(current_sink());
  current_sink() = std::move(sink);
  return previous;
}

}  // namespace stowage
