#include "python/tensors/optimizer_transfers.hpp"

#include <c10/core/GradMode.h>

#include "base/errors.hpp"
#include "python/tensors/offload_engines.hpp"

namespace stowage::torch_offload {

OptimizerTransfers::OptimizerTransfers(const c10::Device& device) : device_(device), engine_(engine_for(device)) {
  STOWAGE_CHECK(engine_ != nullptr || device.is_cpu(), "stowage cannot copy optimizer states of ", device.str(),
                " tensors (a CUDA device, or CPU mode's, is needed)");
}

OptimizerTransfers::~OptimizerTransfers() {
  try {
    synchronize();  // no copy may still write a host buffer or read a gradient once we are gone
  } catch (...) {  // interrupted or stuck: what the copies hold stays held (leaked), never freed early
    for (auto& held : held_) new c10::Storage(std::move(held.second));
  }
}

bool OptimizerTransfers::crosses_link(const at::Tensor& tensor) const {
  return engine_ != nullptr && offloadable(device_, tensor.const_data_ptr());
}

TransferHandle OptimizerTransfers::copy(TransferDirection direction, void* dst, const void* src, std::size_t bytes) {
  const std::unique_ptr<ComputeTimeline> compute = current_timeline(device_, *engine_);
  TransferEngine& transfers = engine_->transfers();
  const Event after = transfers.borrow_event();
  TransferHandle transfer;
  try {
    const bool follows = compute->record(after);
    transfer = transfers.copy(direction, dst, src, bytes, follows ? std::optional<Event>(after) : std::nullopt);
  } catch (...) {
    transfers.recycle_event(after);
    throw;
  }
  transfers.recycle_event(after);  // the copy's wait holds the recording it saw
  if (device_.is_cpu()) {  // CPU mode: done when the call returns, as the compute is this thread
    transfers.wait(transfer, direction == TransferDirection::kToHost ? "the optimizer's gradient copies to host"
                                                                      : "the optimizer's parameter copies back");
  }
  return transfer;
}

void OptimizerTransfers::copy_out(const at::Tensor& destination, const at::Tensor& gradient) {
  STOWAGE_CHECK(destination.is_contiguous() && destination.numel() == gradient.numel(),
                "a gradient of ", gradient.numel(), " elements copied into a host buffer of ", destination.numel());
  at::Tensor source = gradient.reshape(-1);
  if (!crosses_link(source)) {
    destination.copy_(source);
    return;
  }
  if (source.scalar_type() != destination.scalar_type() || !source.is_contiguous()) {
    source = source.to(destination.scalar_type()).contiguous();  // on the compute, before the copy
  }
  release_done();
  TransferHandle transfer = copy(TransferDirection::kToHost, destination.data_ptr(), source.const_data_ptr(),
                                 destination.nbytes());
  if (!device_.is_cpu()) held_.emplace_back(transfer, source.storage());
  last_out_ = CopyMark{engine_, std::move(transfer), destination.nbytes()};
}

std::optional<CopyMark> OptimizerTransfers::copies_out_issued() {
  if (!last_out_.has_value() || last_out_->done()) return std::nullopt;
  return last_out_;
}

std::optional<CopyMark> OptimizerTransfers::write_back(const std::vector<at::Tensor>& params,
                                                       const std::vector<at::Tensor>& sources) {
  STOWAGE_CHECK(params.size() == sources.size(), params.size(), " parameters written back from ", sources.size(),
                " host buffers");
  const c10::NoGradGuard no_grad;
  std::size_t bytes = 0;
  std::optional<TransferHandle> last;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& param = params[i];
    const at::Tensor& source = sources[i];
    const bool direct = param.is_contiguous() && source.is_contiguous() &&
                        param.scalar_type() == source.scalar_type() && param.numel() == source.numel();
    if (!direct || !crosses_link(param)) {
      param.copy_(source.view(param.sizes()));
      continue;
    }
    last = copy(TransferDirection::kToDevice, param.data_ptr(), source.const_data_ptr(), param.nbytes());
    param.unsafeGetTensorImpl()->bump_version();  // as copy_ would: a graph that saved it must see it
    bytes += param.nbytes();
  }
  if (!last.has_value()) return std::nullopt;
  last_back_ = CopyMark{engine_, *last, bytes};
  if (device_.is_cpu()) return std::nullopt;
  return last_back_;
}

void compute_waits_for(const c10::Device& device, const CopyMark& mark) {
  TransferEngine& transfers = mark.engine->transfers();
  const std::unique_ptr<ComputeTimeline> compute = current_timeline(device, *mark.engine);
  const Event arrival = transfers.borrow_event();
  try {
    compute->wait(mark.transfer->finished(), arrival, {"the optimizer's parameter copies back", mark.bytes});
  } catch (...) {
    transfers.recycle_event(arrival);
    throw;
  }
  transfers.recycle_event(arrival);
}

void OptimizerTransfers::written_back() {
  if (!last_back_.has_value() || device_.is_cpu()) return;
  compute_waits_for(device_, *last_back_);
}

void OptimizerTransfers::synchronize() {
  if (last_out_.has_value()) engine_->transfers().wait(last_out_->transfer, "the optimizer's copies to host");
  if (last_back_.has_value()) engine_->transfers().wait(last_back_->transfer, "the optimizer's copies to the device");
  release_done();
}

void OptimizerTransfers::release_done() {
  if (engine_ == nullptr) return;
  std::erase_if(held_, [&](const auto& held) { return engine_->transfers().done(held.first); });
}

}  // namespace stowage::torch_offload
