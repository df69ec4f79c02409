// stowage's error policy (Note [Errors]).
//
// Note [Errors]
// Three kinds of failure reach a caller, each with its own type so callers can tell them apart:
//   - LogicError: the caller broke a documented rule (bad argument, a VMM rule, an unknown
//     pointer). Raised with STOWAGE_CHECK; fixing the caller fixes it.
//   - BackendError: the device (CUDA, or the simulated device) refused or failed an operation
//     that was legal to ask for. Carries the backend's own error name where it has one.
//   - OutOfMemory: a request that cannot be met for want of memory. Soft failures inside a
//     backend are not exceptions: try_* calls return an empty value instead, and the layer that
//     owns the policy (the allocator) decides whether running out is an error.
// InternalError marks a broken invariant of stowage itself (STOWAGE_INTERNAL_ASSERT): a bug,
// never the caller's fault. A wait for the device's work ends in WaitTimeout (a BackendError)
// at its deadline, or in Interrupted when the user interrupts it (Note [Bounded waits]).
//
// Every error records the file and line that raised it. Inside stowage, the device seam
// (DeviceBackend) throws on every failure, free paths included, so the layer above sees each one
// and decides. At the API edge, free paths, destructors and callbacks are noexcept
// (CachingAllocator::free, for one): they count and log misuse instead of throwing, because a
// throw from a destructor terminates the process and torch frees from destructors.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace stowage {

// Base of every exception stowage throws. what() is "<message> (at <file>:<line>)".
class Error : public std::runtime_error {
 public:
  Error(std::string message, const char* file, int line)
      : std::runtime_error(message + " (at " + file + ":" + std::to_string(line) + ")"),
        message_(std::move(message)),
        file_(file),
        line_(line) {}

  // The message without the location suffix.
  const std::string& message() const noexcept { return message_; }
  const char* file() const noexcept { return file_; }
  int line() const noexcept { return line_; }

 private:
  std::string message_;
  const char* file_;
  int line_;
};

// The caller broke a documented rule.
class LogicError : public Error {
 public:
  using Error::Error;
};

// The device failed or refused an operation.
class BackendError : public Error {
 public:
  using Error::Error;
};

// A request cannot be met for want of memory.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

// A stowage invariant is broken: a bug in stowage.
class InternalError : public Error {
 public:
  using Error::Error;
};

// A wait for the device's work passed its deadline (Note [Bounded waits] in
// base/bounded_wait.hpp): the device is stuck or far slower than any real one.
class WaitTimeout : public BackendError {
 public:
  using BackendError::BackendError;
};

// A wait for the device's work was given up because the user interrupted the process (Ctrl-C,
// Note [Bounded waits]); the work itself goes on.
class Interrupted : public Error {
 public:
  using Error::Error;
};

namespace detail {

// Streams every argument into one string; used by the macros below so call sites read
// STOWAGE_CHECK(ok, "size ", size, " is not a multiple of ", granularity).
template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

}  // namespace detail
}  // namespace stowage

// Throws ErrorType with the concatenated message and the current file:line.
#define STOWAGE_THROW(ErrorType, ...) \
  throw ErrorType(::stowage::detail::concat(__VA_ARGS__), __FILE__, __LINE__)

// A caller-facing precondition: throws LogicError when `condition` is false.
#define STOWAGE_CHECK(condition, ...)                   \
  do {                                                  \
    if (!(condition)) {                                 \
      STOWAGE_THROW(::stowage::LogicError, __VA_ARGS__); \
    }                                                   \
  } while (false)

// An invariant of stowage itself: throws InternalError naming the failed condition.
#define STOWAGE_INTERNAL_ASSERT(condition, ...)                                       \
  do {                                                                                \
    if (!(condition)) {                                                               \
      STOWAGE_THROW(::stowage::InternalError, "internal assertion failed: " #condition \
                    " " __VA_OPT__(, ) __VA_ARGS__);                                  \
    }                                                                                 \
  } while (false)
