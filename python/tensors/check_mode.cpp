#include "python/tensors/check_mode.hpp"

#include <atomic>

namespace stowage::torch_offload {

namespace {
std::atomic<bool> checking{false};
std::atomic<std::int64_t> ended{0};
}  // namespace

bool check_mode() noexcept { return checking.load(std::memory_order_relaxed); }
void set_check_mode(bool on) noexcept { checking.store(on, std::memory_order_relaxed); }
std::int64_t steps_ended() noexcept { return ended.load(std::memory_order_relaxed); }
void note_step_ended() noexcept { ended.fetch_add(1, std::memory_order_relaxed); }

}  // namespace stowage::torch_offload
