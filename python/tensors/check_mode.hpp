// Check mode's switch and step count (stowage.checking): whether offloaded tensors carry a checksum
// of their bytes to compare when they come back, and which step is running, for the messages.
//
// Contract: process-wide, thread-safe (atomics); set between steps.
#pragma once

#include <cstdint>

namespace stowage::torch_offload {

bool check_mode() noexcept;
void set_check_mode(bool on) noexcept;
// Steps ended so far (offload_end_step calls): the number of the step now running.
std::int64_t steps_ended() noexcept;
void note_step_ended() noexcept;

}  // namespace stowage::torch_offload
