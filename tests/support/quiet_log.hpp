// Silences stowage's warning lines for as long as it lives (tests that provoke them on purpose).
#pragma once

#include <string_view>
#include <utility>

#include "base/log.hpp"

namespace stowage::testing {

class QuietLog {
 public:
  QuietLog() : previous_(set_log_sink([](std::string_view) {})) {}
  ~QuietLog() { set_log_sink(std::move(previous_)); }
  QuietLog(const QuietLog&) = delete;
  QuietLog& operator=(const QuietLog&) = delete;

 private:
  LogSink previous_;
};

}  // namespace stowage::testing
