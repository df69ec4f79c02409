#include "python/libtorch/gathered_contexts.hpp"

#include <algorithm>

namespace stowage::torch_cuda {

std::uint64_t GatheredContexts::intern(Context context) {
  if (context == nullptr) return 0;
  std::lock_guard lock(mutex_);
  const std::uint64_t handle = next_++;
  contexts_.emplace(handle, std::move(context));
  return handle;
}

GatheredContexts::Context GatheredContexts::find(std::uint64_t handle) const {
  if (handle == 0) return nullptr;
  std::lock_guard lock(mutex_);
  const auto found = contexts_.find(handle);
  return found == contexts_.end() ? nullptr : found->second;
}

bool GatheredContexts::wants_pruning() const {
  std::lock_guard lock(mutex_);
  return contexts_.size() >= prune_at_;
}

void GatheredContexts::prune(const std::unordered_set<std::uint64_t>& referenced) {
  std::lock_guard lock(mutex_);
  std::erase_if(contexts_, [&](const auto& entry) { return !referenced.contains(entry.first); });
  prune_at_ = std::max<std::size_t>(std::size_t{1} << 16, 2 * contexts_.size());
}

void GatheredContexts::clear() {
  std::lock_guard lock(mutex_);
  contexts_.clear();
  prune_at_ = std::size_t{1} << 16;
}

}  // namespace stowage::torch_cuda
