#include "python/tensors/overlapped_step.hpp"

#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <optional>
#include <utility>

#include "python/tensors/optimizer_transfers.hpp"

namespace stowage::torch_offload {

namespace {

// The stream the caller's compute runs on now (nullopt: the CPU's, which has none to follow).
std::optional<c10::Stream> current_stream(const c10::Device& device) {
  if (device.is_cpu()) return std::nullopt;
  return c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
}

}  // namespace

OverlappedStep::OverlappedStep(AdamSlots& slots, AdamSlots::StepInputs inputs, const c10::Device& device)
    : inputs_(std::move(inputs)) {
  const std::optional<c10::Stream> stream = current_stream(device);
  pending_ = std::make_unique<offload::PendingStep>(
      slots.book().bucket_count(), [this, &slots, device, stream](const offload::PendingStep::Land& land) {
        std::optional<c10::StreamGuard> on_stream;
        if (stream.has_value()) on_stream.emplace(*stream);
        slots.commit_step(inputs_, [&land, device](std::size_t bucket, const std::optional<CopyMark>& written_back) {
          offload::PendingStep::Arrival arrival;
          if (written_back.has_value()) arrival = [device, mark = *written_back] { compute_waits_for(device, mark); };
          land(bucket, std::move(arrival));
        });
      });
}

OverlappedStep::~OverlappedStep() = default;

void OverlappedStep::wait_landed(std::size_t bucket) {
  const offload::PendingStep::Arrival arrival = pending_->wait_landed(bucket);
  if (arrival) arrival();
}

void OverlappedStep::finish() { pending_->finish(); }

}  // namespace stowage::torch_offload
