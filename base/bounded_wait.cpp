#include "base/bounded_wait.hpp"

#include <algorithm>
#include <cmath>
#include <thread>

#include "base/byte_units.hpp"
#include "base/errors.hpp"
#include "base/interrupt_watch.hpp"

namespace stowage {

namespace {

constexpr std::chrono::nanoseconds kFirstSlice = std::chrono::microseconds(10);
constexpr std::chrono::nanoseconds kLongestSlice = std::chrono::milliseconds(2);
constexpr double kMaxDeadlineSeconds = 1e9;  // keeps the arithmetic finite for any byte count

}  // namespace

std::chrono::nanoseconds WaitLimits::deadline(std::size_t bytes) const {
  const double seconds = std::min(kMaxDeadlineSeconds, static_cast<double>(bytes) / floor_bytes_per_second);
  return slack + std::chrono::nanoseconds(static_cast<std::int64_t>(std::llround(seconds * 1e9)));
}

void wait_until(const std::function<bool()>& done, const WaitFor& wait, const WaitLimits& limits) {
  if (done()) return;
  const InterruptWatch interrupts;
  const auto start = std::chrono::steady_clock::now();
  const std::chrono::nanoseconds allowed = limits.deadline(wait.bytes);
  std::chrono::nanoseconds slice = kFirstSlice;
  while (!done()) {
    if (interrupts.interrupted() && !InterruptHold::active()) {
      STOWAGE_THROW(Interrupted, "interrupted while waiting for ", wait.what);
    }
    const auto waited = std::chrono::steady_clock::now() - start;
    if (waited >= allowed) {
      STOWAGE_THROW(WaitTimeout, "gave up waiting for ", wait.what, " (", format_bytes(wait.bytes),
                    ") after ", std::chrono::duration<double>(waited).count(), " s, the deadline for that many "
                    "bytes at ", limits.floor_bytes_per_second / 1e6, " MB/s plus ",
                    std::chrono::duration<double>(limits.slack).count(),
                    " s: the device is stuck, or its copies are far slower than any real link");
    }
    std::this_thread::sleep_for(std::min(slice, allowed - waited));
    slice = std::min(kLongestSlice, slice * 2);
  }
}

}  // namespace stowage
