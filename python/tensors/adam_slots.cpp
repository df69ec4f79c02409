#include "python/tensors/adam_slots.hpp"

#include <ATen/ops/equal.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "base/bounded_wait.hpp"
#include "base/byte_units.hpp"
#include "base/errors.hpp"
#include "device/host_memory_probe.hpp"
#include "offload/adam_buckets.hpp"

namespace stowage::torch_offload {

namespace {

std::vector<std::int64_t> rows(const AdamSlots::Indices& slots) { return {slots.begin(), slots.end()}; }

// The tensor's bytes as integers of its element size, so that equal bits compare equal (NaN too).
at::Tensor bits(const at::Tensor& tensor) {
  switch (tensor.element_size()) {
    case 8: return tensor.reshape(-1).view(at::kLong);
    case 4: return tensor.reshape(-1).view(at::kInt);
    default: return tensor.reshape(-1).view(at::kShort);
  }
}

}  // namespace

AdamSlots::AdamSlots(const c10::Device& device, std::string owner, offload::UpdateMode mode,
                     const std::vector<int>& cpus, bool master_weights, std::int64_t bucket_numel,
                     std::optional<std::uint64_t> host_memory_limit, std::function<std::string(std::size_t)> name_of,
                     Point at_point)
    : device_(device), owner_(std::move(owner)), master_weights_(master_weights), bucket_numel_(bucket_numel),
      host_memory_limit_(host_memory_limit),
      name_of_(std::move(name_of)), at_point_(std::move(at_point)), book_(mode), store_(std::make_unique<HostStateStore>(device)),
      transfers_(std::make_unique<OptimizerTransfers>(device)), parameters_(device), gradients_(device),
      ring_(mode == offload::UpdateMode::kExact ? std::make_unique<StagingRing>(*store_) : nullptr),
      queue_(std::make_shared<offload::UpdateQueue>(cpus)) {
  STOWAGE_CHECK(bucket_numel >= 1, "bucket_numel must be positive, not ", bucket_numel);
}

AdamSlots::~AdamSlots() {
  try {
    transfers_->synchronize();  // before the host buffers the copies use go
  } catch (...) {
    // Interrupted or stuck: a copy may still read or write the host buffers, so they are leaked,
    // never freed early, and so are the transfers with the gradients their copies still read
    // (waiting for them again would only pass the same deadline twice).
    for (Bucket& bucket : buckets_) static_cast<void>(bucket.host.release());
    static_cast<void>(transfers_.release());
  }
}

std::vector<offload::BucketPlan> AdamSlots::plan(const Tensors& shards, const Indices& groups) const {
  STOWAGE_CHECK(shards.size() == groups.size(), shards.size(), " parameters with ", groups.size(), " groups");
  std::vector<offload::PlannedParameter> planned;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    planned.push_back({groups[i], element_type_of(shards[i].scalar_type()), shards[i].numel(), 0});
  }
  return offload::plan_buckets(planned, bucket_numel_);
}

std::int64_t AdamSlots::host_bytes(const Tensors& shards, const Indices& groups,
                                   const std::vector<bool>& amsgrad) const {
  STOWAGE_CHECK(amsgrad.size() == shards.size(), amsgrad.size(), " amsgrad flags for ", shards.size(), " parameters");
  std::int64_t needed = 0;
  std::int64_t largest = 0;  // bucket, in bytes of parameters
  for (const offload::BucketPlan& bucket : plan(shards, groups)) {
    const std::size_t first = bucket.members.front();
    const offload::ElementType dtype = element_type_of(shards[first].scalar_type());
    const std::int64_t per_parameter =
        staged() ? offload::staged_bytes_per_parameter(dtype, amsgrad[first], master_weights_)
                 : offload::bytes_per_parameter(dtype, book_.grad_buffers(), amsgrad[first], master_weights_,
                                                book_.state_sets());
    needed += per_parameter * bucket.numel;
    largest = std::max(largest, bucket.numel * static_cast<std::int64_t>(offload::element_size(dtype)));
  }
  const std::size_t buckets = book_.bucket_count() + plan(shards, groups).size();
  return needed + (staged() ? ring_->growth_for(largest, buckets) : 0);
}

void AdamSlots::check_host_room(std::uint64_t needed) const {
  std::optional<std::uint64_t> limit;
  if (host_memory_limit_) {
    const auto taken = static_cast<std::uint64_t>(store_->allocated_bytes());
    limit = *host_memory_limit_ > taken ? *host_memory_limit_ - taken : 0;
  }
  const HostRoom room = host_room(read_host_memory(), limit);
  if (needed <= room.available_bytes) return;
  throw HostMemoryShortage(where() + "'s host states need " + format_bytes(needed) + " of host memory (" +
                           std::to_string(needed) + " bytes) but the process may take only " +
                           format_bytes(room.available_bytes) + " (" + std::to_string(room.available_bytes) +
                           " bytes), set by " + room.limited_by +
                           ". Keep more states on the device (device_fraction=), offload fewer parameters, or free "
                           "host memory.");
}

AdamSlots::Indices AdamSlots::join(const Tensors& shards, const Indices& groups, const std::vector<bool>& amsgrad) {
  check_host_room(static_cast<std::uint64_t>(host_bytes(shards, groups, amsgrad)));
  const at::NoGradGuard no_grad;
  Indices order;
  Indices joined;
  Tensors taken;
  std::int64_t largest = 0;  // bucket, in bytes of parameters
  for (const offload::BucketPlan& plan_ : plan(shards, groups)) {
    const std::size_t first = plan_.members.front();
    std::vector<std::int64_t> numels;
    for (const std::size_t member : plan_.members) numels.push_back(shards[member].numel());
    const bool provisional = book_.state_sets() == 2;  // (Note [Provisional updates out of place])
    auto host = std::make_unique<HostBucket>(*store_, shards[first].scalar_type(), numels, master_weights_,
                                             amsgrad[first], provisional);
    auto kept = staged() ? nullptr
                         : std::make_unique<BucketBuffers>(*store_, *host, book_.grad_buffers(), provisional);
    largest = std::max(largest, host->numel() * static_cast<std::int64_t>(c10::elementSize(host->dtype())));
    const std::size_t bucket = book_.add_bucket(plan_.members.size());
    for (std::size_t k = 0; k < plan_.members.size(); ++k) {
      const at::Tensor& shard = shards[plan_.members[k]];
      Slot slot;
      slot.bucket = bucket;
      slot.offset = host->offsets()[k];
      slot.numel = shard.numel();
      slot.shape = shard.sizes().vec();
      const auto view = [&](const at::Tensor& flat) { return flat.narrow(0, slot.offset, slot.numel).view(slot.shape); };
      slot.states.step = host->steps()[k];
      slot.states.own_master = host->master().defined();
      if (slot.states.own_master || kept != nullptr) {
        slot.states.master = view(slot.states.own_master ? host->master() : kept->parameters());
        slot.states.master.copy_(shard.detach());
        joined.push_back(slots_.size());
        taken.push_back(shard);
      }
      slot.states.exp_avg = view(host->exp_avg());
      slot.states.exp_avg_sq = view(host->exp_avg_sq());
      if (host->max_exp_avg_sq().defined()) slot.states.max_exp_avg_sq = view(host->max_exp_avg_sq());
      order.push_back(plan_.members[k]);
      slots_.push_back(std::move(slot));
    }
    buckets_.push_back({std::move(host), std::move(kept), groups[first], std::nullopt, std::nullopt, nullptr, {}, {}});
  }
  if (staged()) ring_->reserve(largest, book_.bucket_count());
  parameters_.extend(static_cast<std::int64_t>(order.size()));
  gradients_.extend(static_cast<std::int64_t>(order.size()));
  parameters_are(joined, taken);
  return order;
}

std::size_t AdamSlots::group_of(std::size_t bucket) const {
  STOWAGE_CHECK(bucket < buckets_.size(), "no bucket ", bucket);
  return buckets_[bucket].group;
}

SlotStates AdamSlots::states(std::size_t slot) const {
  STOWAGE_CHECK(slot < slots_.size(), "no offloaded parameter ", slot);
  return slots_[slot].states;
}

// --- gradients ----------------------------------------------------------------------------------

void AdamSlots::copy_out(std::size_t slot, const at::Tensor& shard) {
  Slot& s = slots_.at(slot);
  if (shard.numel() != s.numel) {
    throw std::invalid_argument(where() + ": the gradient of " + name_of_(slot) + " has " +
                                std::to_string(shard.numel()) + " elements where the parameter has " +
                                std::to_string(s.numel));
  }
  const BucketBuffers& kept = *buckets_[s.bucket].kept;
  const auto buffer = static_cast<std::size_t>(book_.grad_buffer());
  transfers_->copy_out(kept.gradients().at(buffer).narrow(0, s.offset, s.numel), shard);
  gradients_.remember_one(static_cast<std::int64_t>(slot), shard);  // the bytes the copy reads
  book_.arrive(slot, shard._version());
}

void AdamSlots::refuse_sparse(std::size_t slot, const at::Tensor& gradient) const {
  if (!gradient.is_sparse()) return;
  throw std::runtime_error(where() + ": " + name_of_(slot) + " has a sparse gradient (an nn.Embedding(sparse=True)?), "
                           "which Adam does not take (torch's refuses it too): use torch.optim.SparseAdam for it, or "
                           "a dense embedding");
}

std::int64_t AdamSlots::arrive(std::size_t slot, const at::Tensor& gradient, const at::Tensor& shard) {
  STOWAGE_CHECK(!staged(), "update='exact' copies gradients at step(), not as they arrive");
  const std::size_t bucket = book_.bucket_of(slot);
  refuse_sparse(slot, gradient);
  if (book_.mode() == offload::UpdateMode::kInBackward && book_.updated(bucket)) return kArrivedTwice;
  copy_out(slot, shard);
  if (!book_.ready(bucket)) return -1;
  buckets_[bucket].copied = transfers_->copies_out_issued();
  return static_cast<std::int64_t>(bucket);
}

// Bytes, not identities or versions: a gradient copied into .grad (DDP's buckets), or written
// back unchanged, is the same gradient; one a hook or a .data write changed is not.
std::vector<bool> AdamSlots::changed_gradients(const Tensors& grads, const Tensors& shards) {
  STOWAGE_CHECK(grads.size() == slots_.size() && shards.size() == slots_.size(), "gradients for ", grads.size(),
                " of ", slots_.size(), " offloaded parameters");
  std::vector<bool> changed(slots_.size(), false);
  Indices present;
  Tensors present_shards;
  for (std::size_t slot = 0; slot < slots_.size(); ++slot) {
    if (!book_.arrived(slot)) continue;
    if (!grads[slot].defined() || grads[slot].is_sparse() || shards[slot].numel() != slots_[slot].numel) {
      changed[slot] = true;  // dropped, or a gradient copy_out refuses with its reason
    } else {
      present.push_back(slot);
      present_shards.push_back(shards[slot]);
    }
  }
  const std::vector<bool> flags = gradients_.changed(rows(present), present_shards);
  for (std::size_t i = 0; i < present.size(); ++i) changed[present[i]] = flags[i];
  return changed;
}

bool AdamSlots::collect_late(const Tensors& grads, const Tensors& shards) {
  const std::vector<bool> changed = changed_gradients(grads, shards);
  bool recopied = false;
  for (std::size_t slot = 0; slot < slots_.size(); ++slot) {
    const bool arrived = book_.arrived(slot);
    if (!grads[slot].defined()) {
      if (arrived) book_.drop(slot);
      continue;
    }
    refuse_sparse(slot, grads[slot]);
    if (arrived && !changed[slot]) continue;
    recopied = recopied || arrived;
    copy_out(slot, shards[slot]);
    buckets_[slots_[slot].bucket].copied.reset();  // a new mark covers this copy too
  }
  for (std::size_t bucket = 0; bucket < buckets_.size(); ++bucket) {
    if (book_.arrived_in(bucket) > 0 && !buckets_[bucket].copied.has_value()) {
      buckets_[bucket].copied = transfers_->copies_out_issued();
    }
  }
  return recopied;
}

std::int64_t AdamSlots::stale_gradients(const Tensors& grads, const Tensors& shards) {
  if (book_.slots_updated(true).empty()) return -1;
  const std::vector<bool> changed = changed_gradients(grads, shards);
  std::int64_t stale = 0;
  for (std::size_t slot = 0; slot < slots_.size(); ++slot) {
    if (changed[slot] && book_.updated(slots_[slot].bucket)) ++stale;
  }
  return stale;
}

std::int64_t AdamSlots::first_changed_gradient(const Tensors& shards) {
  STOWAGE_CHECK(shards.size() == slots_.size(), "gradients for ", shards.size(), " of ", slots_.size(),
                " offloaded parameters");
  const at::NoGradGuard no_grad;
  transfers_->synchronize();
  const auto buffer = static_cast<std::size_t>(book_.grad_buffer());
  for (std::size_t index = 0; index < slots_.size(); ++index) {
    if (!book_.arrived(index) || !shards[index].defined()) continue;
    const Slot& slot = slots_[index];
    const at::Tensor copied = buckets_[slot.bucket].kept->gradients().at(buffer).narrow(0, slot.offset, slot.numel);
    const at::Tensor now = shards[index].detach().reshape(-1).to(copied.scalar_type()).cpu();
    if (!at::equal(bits(now), bits(copied))) return static_cast<std::int64_t>(index);
  }
  return -1;
}

// --- parameters written by someone else ---------------------------------------------------------

AdamSlots::Indices AdamSlots::written(const Indices& slots, const Tensors& shards) {
  const std::vector<bool> flags = parameters_.changed(rows(slots), shards);
  Indices out;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (flags[i]) out.push_back(slots[i]);
  }
  return out;
}

AdamSlots::Indices AdamSlots::take_written(const Indices& slots, const Tensors& shards) {
  STOWAGE_CHECK(slots.size() == shards.size(), slots.size(), " parameters with ", shards.size(), " tensors");
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const Slot& slot = slots_.at(slots[i]);
    if (shards[i].numel() == slot.numel) continue;
    throw std::invalid_argument(where() + ": " + name_of_(slots[i]) + " was replaced by a tensor of " +
                                std::to_string(shards[i].numel()) + " elements where it had " +
                                std::to_string(slot.numel) + "; make a new optimizer for parameters of a new shape");
  }
  const at::NoGradGuard no_grad;
  const std::vector<bool> flags = parameters_.changed(rows(slots), shards);
  Indices taken;
  Tensors taken_shards;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (!flags[i]) continue;
    const Slot& slot = slots_[slots[i]];
    const at::Tensor flat = shards[i].detach().reshape(-1);
    slot.states.master.view(-1).copy_(flat);
    const BucketBuffers* kept = buckets_[slot.bucket].kept.get();
    if (kept != nullptr && kept->output().defined()) kept->output().narrow(0, slot.offset, slot.numel).copy_(flat);
    taken.push_back(slots[i]);
    taken_shards.push_back(shards[i]);
  }
  parameters_are(taken, taken_shards);
  return taken;
}

void AdamSlots::parameters_are(const Indices& slots, const Tensors& shards) {
  STOWAGE_CHECK(slots.size() == shards.size(), slots.size(), " parameters with ", shards.size(), " tensors");
  const Indices copied = with_host_copy(slots);
  if (copied.size() == slots.size()) return parameters_.remember(rows(slots), shards);
  Tensors copied_shards;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (slots_.at(slots[i]).states.master.defined()) copied_shards.push_back(shards[i]);
  }
  parameters_.remember(rows(copied), copied_shards);
}

AdamSlots::Indices AdamSlots::with_host_copy(const Indices& slots) const {
  Indices out;
  for (const std::size_t slot : slots) {
    if (slots_.at(slot).states.master.defined()) out.push_back(slot);
  }
  return out;
}

// --- updates ------------------------------------------------------------------------------------

void AdamSlots::check_options(const std::vector<GroupOptions>& groups) const {
  for (const Bucket& bucket : buckets_) check_options(bucket, groups.at(bucket.group));
}

void AdamSlots::check_options(const Bucket& bucket, const GroupOptions& options) const {
  if (options.amsgrad && !bucket.host->max_exp_avg_sq().defined()) {
    throw std::invalid_argument(where() + ": amsgrad was turned on in a param group after its states were made; "
                                          "set it when the optimizer is made");
  }
}

AdamSlots::Indices AdamSlots::outdated_updates(const std::vector<GroupOptions>& groups) const {
  Indices outdated;
  for (const std::size_t bucket : book_.provisional()) {
    if (!(buckets_[bucket].options == groups.at(buckets_[bucket].group))) outdated.push_back(bucket);
  }
  return outdated;
}

AdamSlots::Indices AdamSlots::submit(std::size_t bucket, const GroupOptions& options, double grad_scale) {
  STOWAGE_CHECK(bucket < buckets_.size(), "no bucket ", bucket);
  Bucket& b = buckets_[bucket];
  STOWAGE_CHECK(b.kept != nullptr, "bucket ", bucket, " is staged: its update is submitted as it is staged");
  if (book_.arrived_in(bucket) == 0) return {};
  std::vector<CopyMark> waits;
  for (const std::optional<CopyMark>& mark : {b.copied, b.returned}) {
    if (mark.has_value()) waits.push_back(*mark);
  }
  return submit_over(bucket, options, grad_scale, b.kept->for_update(book_.grad_buffer(), std::move(waits)),
                     b.kept->written_back());
}

AdamSlots::Indices AdamSlots::submit_over(std::size_t bucket, const GroupOptions& options, double grad_scale,
                                          UpdateBuffers buffers, at::Tensor written_back) {
  Bucket& b = buckets_[bucket];
  check_options(b, options);
  BucketUpdate update;
  update.hyper = offload::AdamWHyperparameters{options.lr, options.beta1, options.beta2, options.eps,
                                               options.weight_decay, grad_scale};
  update.hyper.decoupled_weight_decay = options.decoupled_weight_decay;
  update.hyper.maximize = options.maximize;
  update.provisional = book_.mode() == offload::UpdateMode::kInBackward;
  update.cpu_sqrt = device_.is_cpu();  // torch's CPU AdamW takes its CPU's square root
  b.ticket = b.host->submit(*queue_, update, book_.has_gradient(bucket), std::move(buffers));
  b.options = options;
  b.written_back = std::move(written_back);
  Indices slots = book_.submitted(bucket);
  if (b.ticket == nullptr) book_.clear_update(bucket);  // parameters without elements: nothing to run
  for (const std::size_t slot : slots) state_changes_.emplace_back(slot, true);
  return slots;
}

void AdamSlots::wait_ended(std::size_t bucket) {
  STOWAGE_CHECK(bucket < buckets_.size(), "no bucket ", bucket);
  const std::shared_ptr<offload::UpdateTicket> ticket = buckets_[bucket].ticket;
  if (ticket == nullptr) return;
  wait_until([&] { return ticket->done(); },
             {"the host update of bucket " + std::to_string(bucket),
              static_cast<std::size_t>(buckets_[bucket].host->bytes())});
}

void AdamSlots::finish(std::size_t bucket) {
  wait_ended(bucket);
  if (buckets_[bucket].ticket != nullptr) buckets_[bucket].ticket->take();
}

void AdamSlots::finish_pending() {
  for (const std::size_t bucket : book_.pending_buckets()) {
    if (book_.updated(bucket)) finish(bucket);
  }
}

void AdamSlots::write_back(std::size_t bucket, const Tensors& shards) {
  if (!book_.updated(bucket)) return;
  finish(bucket);
  Bucket& b = buckets_[bucket];
  b.host->stand();  // a provisional update's results become what is written back
  const Indices slots = book_.updated_slots(bucket);
  STOWAGE_CHECK(shards.size() == slots_.size(), shards.size(), " parameters for ", slots_.size(), " slots");
  Tensors targets;
  Tensors views;
  for (const std::size_t slot : slots) {
    targets.push_back(shards[slot]);
    views.push_back(b.written_back.narrow(0, slots_[slot].offset, slots_[slot].numel).view(shards[slot].sizes()));
  }
  b.returned = transfers_->write_back(targets, views);
  if (staged()) ring_->returned(bucket, b.returned);
  clear_update(bucket);
  const Indices watched = with_host_copy(slots);
  if (!watched.empty()) {
    transfers_->written_back();  // the checksums below read the parameters written back
    parameters_are(slots, targets);
  }
  check_arrivals(slots, targets, views);  // (before the buffers are used again)
}

std::int64_t AdamSlots::first_changed_arrival(const Indices& slots, const Tensors& shards, const Tensors& results) {
  STOWAGE_CHECK(slots.size() == shards.size() && slots.size() == results.size(), slots.size(), " parameters with ",
                shards.size(), " tensors and ", results.size(), " results");
  transfers_->synchronize();
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (!at::equal(bits(shards[i].detach().cpu()), bits(results[i]))) return static_cast<std::int64_t>(slots[i]);
  }
  return -1;
}

void AdamSlots::roll_back(const Indices& buckets) {
  const Indices provisional = book_.provisional();
  for (const std::size_t bucket : buckets) {
    STOWAGE_CHECK(std::find(provisional.begin(), provisional.end(), bucket) != provisional.end(), "bucket ", bucket,
                  " has no provisional update to undo");
  }
  for (const std::size_t bucket : buckets) wait_ended(bucket);  // (an update that threw is undone too)
  for (const std::size_t bucket : buckets) {
    if (buckets_[bucket].host->restore()) {
      const std::size_t first = book_.first_slot(bucket);
      for (std::size_t slot = first; slot < first + book_.size(bucket); ++slot) {
        if (slots_[slot].states.step.item<float>() == 0.0F) state_changes_.emplace_back(slot, false);
      }
    }
    clear_update(bucket);
  }
}

void AdamSlots::clear_update(std::size_t bucket) {
  book_.clear_update(bucket);
  buckets_[bucket].ticket.reset();
  if (staged()) buckets_[bucket].written_back = at::Tensor();  // (its ring slot goes to the next bucket)
}

void AdamSlots::end_step() {
  for (Bucket& bucket : buckets_) {
    if (book_.mode() == offload::UpdateMode::kInBackward) bucket.ticket.reset();
    bucket.host->stand();
  }
  book_.end_step();
  clip_ = at::Tensor();
}

void AdamSlots::discard_step() {
  end_step();
  for (std::size_t bucket = 0; bucket < buckets_.size(); ++bucket) {
    if (!book_.pending(bucket)) clear_update(bucket);
  }
}

}  // namespace stowage::torch_offload
