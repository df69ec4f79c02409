// Captures stowage's warning lines for as long as it lives.
#pragma once

#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/log.hpp"

namespace stowage::testing {

class CapturedLog {
 public:
  CapturedLog() {
    previous_ = set_log_sink([this](std::string_view line) {
      std::lock_guard lock(mutex_);
      lines_.emplace_back(line);
    });
  }
  ~CapturedLog() { set_log_sink(std::move(previous_)); }
  CapturedLog(const CapturedLog&) = delete;
  CapturedLog& operator=(const CapturedLog&) = delete;

  std::vector<std::string> lines() const {
    std::lock_guard lock(mutex_);
    return lines_;
  }

 private:
  LogSink previous_;
  mutable std::mutex mutex_;
  std::vector<std::string> lines_;
};

}  // namespace stowage::testing
