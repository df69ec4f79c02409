// Where stowage's warnings go: one line each, to stderr by default.
//
// The free path reports misuse here instead of throwing (Note [Errors]). Tests and embedding
// programs may redirect the lines with set_log_sink; passing an empty function restores stderr.
//
// Contract: thread-safe; the sink is called under a lock, one line at a time, and must not log.
#pragma once

#include <functional>
#include <string_view>

namespace stowage {

using LogSink = std::function<void(std::string_view line)>;

// Writes "stowage: warning: <message>" to the sink. Never throws.
void log_warning(std::string_view message) noexcept;
// Replaces the sink; returns the previous one (empty when it was stderr).
LogSink set_log_sink(LogSink sink);

}  // namespace stowage
