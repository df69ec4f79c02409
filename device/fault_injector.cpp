#include "device/fault_injector.hpp"

#include <vector>

#include "base/errors.hpp"

namespace stowage {

std::string_view backend_call_name(BackendCall call) noexcept {
  switch (call) {
    case BackendCall::kAllocateSegment: return "allocate_segment";
    case BackendCall::kFreeSegment: return "free_segment";
    case BackendCall::kReserve: return "reserve_address_range";
    case BackendCall::kReleaseReservation: return "release_address_range";
    case BackendCall::kCreatePhysical: return "create_physical";
    case BackendCall::kReleasePhysical: return "release_physical";
    case BackendCall::kMap: return "map";
    case BackendCall::kSetAccess: return "set_access";
    case BackendCall::kUnmap: return "unmap";
    case BackendCall::kCreateStream: return "create_stream";
    case BackendCall::kCreateEvent: return "create_event";
    case BackendCall::kRecordEvent: return "record_event";
    case BackendCall::kCopy: return "copy_async";
    case BackendCall::kMemset: return "memset_async";
    case BackendCall::kAllocatePinned: return "allocate_pinned";
    case BackendCall::kFreePinned: return "free_pinned";
    case BackendCall::kRegisterHost: return "register_host";
    case BackendCall::kUnregisterHost: return "unregister_host";
    case BackendCall::kSynchronize: return "synchronize";
    case BackendCall::kCount: break;
  }
  return "unknown";
}

void FaultInjector::fail_nth(BackendCall call, std::uint64_t n) {
  STOWAGE_CHECK(n >= 1, "fail_nth counts from 1 (the next call), got ", n);
  std::lock_guard lock(mutex_);
  armed_.push_back({call, calls_[static_cast<std::size_t>(call)] + n});
}

void FaultInjector::corrupt_nth(BackendCall call, std::uint64_t n) {
  STOWAGE_CHECK(n >= 1, "corrupt_nth counts from 1 (the next call), got ", n);
  std::lock_guard lock(mutex_);
  corruptions_.push_back({call, calls_[static_cast<std::size_t>(call)] + n});
}

bool FaultInjector::should_corrupt(BackendCall call, std::uint64_t call_number) {
  std::lock_guard lock(mutex_);
  const auto hits = std::erase_if(corruptions_, [&](const Armed& armed) {
    return armed.call == call && armed.at_call == call_number;
  });
  if (hits == 0) return false;
  ++fired_;
  return true;
}

void FaultInjector::clear() {
  std::lock_guard lock(mutex_);
  armed_.clear();
  corruptions_.clear();
}

bool FaultInjector::should_fail(BackendCall call, std::uint64_t* call_number) {
  std::lock_guard lock(mutex_);
  const std::uint64_t count = ++calls_[static_cast<std::size_t>(call)];
  if (call_number != nullptr) *call_number = count;
  const auto hits = std::erase_if(armed_, [&](const Armed& armed) {
    return armed.call == call && armed.at_call == count;
  });
  if (hits == 0) return false;
  ++fired_;
  return true;
}

std::uint64_t FaultInjector::calls(BackendCall call) const {
  std::lock_guard lock(mutex_);
  return calls_[static_cast<std::size_t>(call)];
}

std::uint64_t FaultInjector::faults_fired() const {
  std::lock_guard lock(mutex_);
  return fired_;
}

}  // namespace stowage
