#include "planner/cost_model.hpp"

#include <cmath>

#include "base/errors.hpp"

namespace stowage::planner {

void CostModel::validate() const {
  STOWAGE_CHECK(std::isfinite(to_host_bytes_per_ms) && to_host_bytes_per_ms > 0 &&
                    std::isfinite(to_device_bytes_per_ms) && to_device_bytes_per_ms > 0,
                "copy bandwidths must be positive, not ", to_host_bytes_per_ms, " (to host) and ",
                to_device_bytes_per_ms, " (to device) bytes/ms");
}

}  // namespace stowage::planner
