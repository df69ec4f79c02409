#include "python/tensors/parameter_transfers.hpp"

#include <c10/core/TensorImpl.h>

#include <cstdint>

#include "base/errors.hpp"

namespace stowage::torch_offload {

void ParameterTransfers::fill(const std::vector<at::Tensor>& copies, const std::vector<at::Tensor>& hosts) {
  STOWAGE_CHECK(copies.size() == hosts.size(), copies.size(), " device copies filled from ", hosts.size(),
                " host parameters");
  std::vector<std::int64_t> versions;
  versions.reserve(copies.size());
  for (std::size_t i = 0; i < copies.size(); ++i) {
    STOWAGE_CHECK(copies[i].sizes() == hosts[i].sizes() && copies[i].scalar_type() == hosts[i].scalar_type(),
                  "a device copy of shape ", copies[i].sizes(), " (", c10::toString(copies[i].scalar_type()),
                  ") filled from a host parameter of shape ", hosts[i].sizes(), " (",
                  c10::toString(hosts[i].scalar_type()), ")");
    versions.push_back(static_cast<std::int64_t>(copies[i].unsafeGetTensorImpl()->version_counter().current_version()));
  }
  transfers_.write_back(copies, hosts);
  for (std::size_t i = 0; i < copies.size(); ++i) {
    c10::VariableVersion counter = copies[i].unsafeGetTensorImpl()->version_counter();  // shares the count
    counter.set_version(versions[i]);
  }
}

std::uint64_t ParameterTransfers::send_gradient(const at::Tensor& destination, const at::Tensor& gradient) {
  transfers_.copy_out(destination, gradient);
  in_flight_.push_back(transfers_.copies_out_issued());  // this copy's mark: it is the last issued
  return queue_.send(static_cast<std::size_t>(destination.nbytes()));
}

bool ParameterTransfers::land_oldest(bool wait) {
  const std::optional<CopyMark>& mark = in_flight_.front();
  if (mark.has_value() && !mark->done()) {
    if (!wait) return false;
    ++host_waits_;
    mark->engine->transfers().wait(mark->transfer, "an offloaded parameter's gradient copy to the host");
  }
  queue_.land(*queue_.oldest());
  in_flight_.pop_front();
  return true;
}

std::size_t ParameterTransfers::landed() {
  std::size_t count = 0;
  while (!in_flight_.empty() && land_oldest(false)) ++count;
  if (count > 0) transfers_.release_done();
  return count;
}

std::size_t ParameterTransfers::land_over_bound() {
  const std::size_t count = queue_.over_bound();
  for (std::size_t k = 0; k < count; ++k) land_oldest(true);
  if (count > 0) transfers_.release_done();
  return count;
}

std::size_t ParameterTransfers::land_all() {
  const std::size_t count = in_flight_.size();
  while (!in_flight_.empty()) land_oldest(true);
  transfers_.release_done();
  return count;
}

}  // namespace stowage::torch_offload
