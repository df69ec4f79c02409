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

std::size_t ParameterTransfers::land(std::size_t count) {
  if (count == 0) return 0;
  // one wait, for the last of them: the copies complete in the order of the engine's one
  // device-to-host stream, so the earlier ones have landed with it
  const std::optional<CopyMark>& last = in_flight_[count - 1];
  if (last.has_value() && !last->done()) {
    ++host_waits_;
    last->engine->transfers().wait(last->transfer, "offloaded parameters' gradient copies to the host");
  }
  for (std::size_t k = 0; k < count; ++k) {
    queue_.land(*queue_.oldest());
    in_flight_.pop_front();
  }
  transfers_.release_done();
  return count;
}

std::size_t ParameterTransfers::landed() {
  std::size_t count = 0;
  while (count < in_flight_.size() && (!in_flight_[count].has_value() || in_flight_[count]->done())) ++count;
  return land(count);
}

std::size_t ParameterTransfers::land_over_bound() { return land(queue_.over_bound()); }

std::size_t ParameterTransfers::land_all() { return land(in_flight_.size()); }

}  // namespace stowage::torch_offload
