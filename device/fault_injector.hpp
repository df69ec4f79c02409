// Makes chosen backend calls fail, to test the paths that handle device failures.
//
// Contract: thread-safe. fail_nth(call, n) arms one fault: the n-th call of that kind from now
// (n = 1: the next one) fails. Several faults may be armed at once, for one kind or several.
// corrupt_nth(call, n) arms a silent fault instead: the n-th copy from now completes with one
// byte of its destination flipped, for tests of the checks that must catch corrupted data.
// Every call is also counted, armed or not, so tests can assert how often a path reached the
// device (calls(kind)). The injector only decides; the backend decides what failing means:
// try_* calls report out-of-memory (an empty result), every other call throws BackendError.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string_view>
#include <vector>

namespace stowage {

// Every kind of backend call that can be counted and made to fail.
enum class BackendCall : std::uint8_t {
  kAllocateSegment,
  kFreeSegment,
  kReserve,
  kReleaseReservation,
  kCreatePhysical,
  kReleasePhysical,
  kMap,
  kSetAccess,
  kUnmap,
  kCreateStream,
  kCreateEvent,
  kRecordEvent,
  kCopy,
  kMemset,
  kAllocatePinned,
  kFreePinned,
  kRegisterHost,
  kUnregisterHost,
  kSynchronize,  // synchronize_stream, synchronize_device, synchronize_event
  kCount,  // the number of kinds, not a kind
};
inline constexpr std::size_t kBackendCallKinds = static_cast<std::size_t>(BackendCall::kCount);

// "allocate_segment", "map", ...: the name used in messages and in the selfcheck's output.
std::string_view backend_call_name(BackendCall call) noexcept;

class FaultInjector {
 public:
  // Arms a fault on the n-th call of `call` from now; n >= 1.
  void fail_nth(BackendCall call, std::uint64_t n);
  // Arms a corruption of the n-th call of `call` from now (the backend flips a byte of what that
  // call wrote); n >= 1.
  void corrupt_nth(BackendCall call, std::uint64_t n);
  // Whether a corruption is armed for call number `call_number` of `call` (as should_fail
  // numbered it); disarms it.
  bool should_corrupt(BackendCall call, std::uint64_t call_number);
  // Disarms every fault.
  void clear();
  // Counts one call of `call`; true when an armed fault fires on it (every fault armed for that
  // call fires together). `call_number`, when given, receives the call's number.
  bool should_fail(BackendCall call, std::uint64_t* call_number = nullptr);
  std::uint64_t calls(BackendCall call) const;
  std::uint64_t faults_fired() const;

 private:
  struct Armed {
    BackendCall call;
    std::uint64_t at_call;  // fires when calls_[call] reaches this count
  };

  mutable std::mutex mutex_;
  std::array<std::uint64_t, kBackendCallKinds> calls_{};
  std::vector<Armed> armed_;
  std::vector<Armed> corruptions_;
  std::uint64_t fired_ = 0;
};

}  // namespace stowage
