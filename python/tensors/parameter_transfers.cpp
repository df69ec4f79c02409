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

}  // namespace stowage::torch_offload
