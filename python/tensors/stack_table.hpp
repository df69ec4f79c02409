// The stacks behind allocator history: captured at alloc and free, resolved at snapshot time.
//
// capture() runs before the allocator takes its lock (Note [Stacks before the lock]). It takes
// the GIL only on threads that already have a Python thread state: torch's intra-op worker
// threads have none, and making one wait for the GIL while the thread that holds it waits for
// them would deadlock; their allocations get no Python stack. With C++ stacks on, the return
// addresses are recorded (cheap) and symbolised only when a snapshot asks for them.
//
// Contract: thread-safe. Handles are 1-based indexes into an append-only table; identical stacks
// share a handle, so the table grows with the distinct stacks, not with the events.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace stowage::torch_cpu {

struct Frame {
  std::string filename;
  int line = 0;
  std::string name;
};

class StackTable {
 public:
  // What capture() records: Python frames, and C++ return addresses too when `cpp` is set.
  void configure(bool python, bool cpp);
  // The calling thread's stack as a handle; 0 when there is nothing to record.
  std::uint64_t capture() noexcept;
  // Python frames innermost first, then the C++ frames, symbolised now.
  std::vector<Frame> frames(std::uint64_t handle) const;
  // For pthread_atfork, as CachingAllocator's: the lock is held across fork().
  void prepare_fork();
  void after_fork();

 private:
  struct Stack {
    std::vector<Frame> python;
    std::vector<void*> cpp;
  };

  mutable std::mutex mutex_;
  bool python_ = true;
  bool cpp_ = false;
  std::vector<Stack> stacks_;
  std::unordered_map<std::string, std::uint64_t> handles_;  // stack key -> handle
};

}  // namespace stowage::torch_cpu
