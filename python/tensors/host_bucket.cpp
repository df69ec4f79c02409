#include "python/tensors/host_bucket.hpp"

#include <ATen/ops/zeros.h>
#include <dlfcn.h>

#include <cstring>
#include <string>
#include <utility>

#include "base/bounded_wait.hpp"
#include "base/errors.hpp"
#include "base/interrupt_watch.hpp"
#include "offload/adam_buckets.hpp"

namespace stowage::torch_offload {

using offload::ElementType;

namespace {

using MklVectorSqrt = void (*)(int count, const float* in, float* out, long long mode);
using MklSetLocalThreads = int (*)(int threads);

// torch's mode for MKL's vector math (ATen/cpu/vml.h), from mkl_vml_defines.h: VML_HA (high
// accuracy) | VML_FTZDAZ_OFF (denormals kept) | VML_ERRMODE_IGNORE.
constexpr long long kVmlHighAccuracy = 0x00000002;
constexpr long long kVmlDenormalsKept = 0x00140000;
constexpr long long kVmlErrorsIgnored = 0x00000100;
constexpr long long kTorchVmlMode = kVmlHighAccuracy | kVmlDenormalsKept | kVmlErrorsIgnored;

// MKL's entry points in torch's library; either may be null (a torch without MKL).
struct TorchMklSqrt {
  MklVectorSqrt sqrt = nullptr;
  MklSetLocalThreads set_local_threads = nullptr;
};

const TorchMklSqrt& torch_mkl_sqrt() {
  static const TorchMklSqrt found = [] {
    void* library = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD);
    if (library == nullptr) return TorchMklSqrt{};
    return TorchMklSqrt{reinterpret_cast<MklVectorSqrt>(dlsym(library, "vmsSqrt")),
                        reinterpret_cast<MklSetLocalThreads>(dlsym(library, "MKL_Set_Num_Threads_Local"))};
  }();
  return found;
}

// MKL's square root in torch's mode, on the calling thread alone: called from a thread outside
// any OpenMP region, MKL would otherwise open one per call.
void mkl_sqrt_here(int count, const float* in, float* out) {
  const TorchMklSqrt& f = torch_mkl_sqrt();
  if (f.set_local_threads == nullptr) return f.sqrt(count, in, out, kTorchVmlMode);
  const int previous = f.set_local_threads(1);
  f.sqrt(count, in, out, kTorchVmlMode);
  f.set_local_threads(previous);
}

}  // namespace

// torch's own float square root on this CPU: torch takes it from MKL's vector math where it was
// built with MKL, which is not always correctly rounded; the host update takes the same one so
// that it rounds where torch's AdamW rounds (Note [torch's roundings]). Null where torch has no
// MKL (its sqrt is then the correctly rounded one, as std::sqrt).
offload::VectorSqrt torch_vector_sqrt() {
  return torch_mkl_sqrt().sqrt != nullptr ? &mkl_sqrt_here : nullptr;
}

namespace {

unsigned char* at_element(void* base, std::int64_t index, std::size_t size) {
  return static_cast<unsigned char*>(base) + static_cast<std::size_t>(index) * size;
}

}  // namespace

// The blocks behind the bucket's states, and the undo copies of them. Update jobs hold it.
struct HostBucket::Memory {
  std::vector<std::shared_ptr<void>> blocks;
  void* master = nullptr;  // own fp32 masters (master_weights), else null
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
  void* max_exp_avg_sq = nullptr;
  ElementType dtype = ElementType::kFloat32;  // the parameters'
  std::size_t state_bytes = 0;                // of one state buffer
  void* undo_parameters = nullptr;               // the buffers' parameters the saved update read
  std::vector<std::vector<unsigned char>> undo;  // the states before a provisional update

  std::vector<void*> states(void* parameters) const {
    std::vector<void*> out_states{parameters, exp_avg, exp_avg_sq};
    if (max_exp_avg_sq != nullptr) out_states.push_back(max_exp_avg_sq);
    return out_states;
  }
  void save(void* parameters) {
    const std::vector<void*> all = states(parameters);
    undo.resize(all.size());
    for (std::size_t i = 0; i < all.size(); ++i) {
      undo[i].resize(state_bytes);
      std::memcpy(undo[i].data(), all[i], state_bytes);
    }
  }
  void run(const BucketUpdate& update, const UpdateBuffers& buffers, const offload::UpdateRun& run, int threads,
           bool narrow) const;
};

void HostBucket::Memory::run(const BucketUpdate& update, const UpdateBuffers& buffers, const offload::UpdateRun& r,
                             int threads, bool narrow) const {
  const std::size_t size = offload::element_size(dtype);
  const auto count = static_cast<std::size_t>(r.end - r.begin);
  const void* grad = static_cast<const unsigned char*>(buffers.gradients) + static_cast<std::size_t>(r.begin) * size;
  if (narrow) {
    offload::NarrowAdamBuffers b;
    b.param = at_element(buffers.parameters, r.begin, size);
    b.exp_avg = at_element(exp_avg, r.begin, size);
    b.exp_avg_sq = at_element(exp_avg_sq, r.begin, size);
    b.grad = grad;
    if (max_exp_avg_sq != nullptr) b.max_exp_avg_sq = at_element(max_exp_avg_sq, r.begin, size);
    b.type = dtype;
    b.count = count;
    offload::adam_step_narrow(update.hyper, r.step, b, threads);
    return;
  }
  offload::AdamWBuffers b;
  b.master = reinterpret_cast<float*>(at_element(buffers.parameters, r.begin, 4));
  b.exp_avg = reinterpret_cast<float*>(at_element(exp_avg, r.begin, 4));
  b.exp_avg_sq = reinterpret_cast<float*>(at_element(exp_avg_sq, r.begin, 4));
  b.grad = grad;
  b.grad_type = dtype;
  if (buffers.output != nullptr) {
    b.out = at_element(buffers.output, r.begin, size);
    b.out_type = dtype;
  }
  if (max_exp_avg_sq != nullptr) b.max_exp_avg_sq = reinterpret_cast<float*>(at_element(max_exp_avg_sq, r.begin, 4));
  b.count = count;
  offload::AdamWHyperparameters hyper = update.hyper;
  hyper.vector_sqrt = update.cpu_sqrt ? torch_vector_sqrt() : nullptr;
  offload::adamw_step(hyper, r.step, b, threads);
}

HostBucket::HostBucket(HostStateStore& store, at::ScalarType dtype, const std::vector<std::int64_t>& numels,
                       bool master_weights, bool amsgrad)
    : narrow_(offload::is_narrow(element_type_of(dtype), master_weights)), dtype_(dtype),
      state_type_(narrow_ ? dtype : at::kFloat), numels_(numels), memory_(std::make_shared<Memory>()) {
  for (const std::int64_t numel : numels) {
    STOWAGE_CHECK(numel >= 0, "a parameter of ", numel, " elements");
    offsets_.push_back(numel_);
    numel_ += numel;
    steps_.push_back(at::zeros({}, at::TensorOptions().dtype(at::kFloat)));
  }
  Memory& m = *memory_;
  m.dtype = element_type_of(dtype);
  m.state_bytes = static_cast<std::size_t>(numel_) * c10::elementSize(state_type_);
  const auto make = [&](void*& pointer, bool zero) {
    std::shared_ptr<void> block = store.allocate(m.state_bytes);
    pointer = block.get();
    m.blocks.push_back(block);
    at::Tensor tensor = HostStateStore::tensor_over(block, numel_, state_type_);
    bytes_ += static_cast<std::int64_t>(tensor.nbytes());
    return zero ? tensor.zero_() : tensor;
  };
  if (state_type_ != dtype) master_ = make(m.master, false);
  exp_avg_ = make(m.exp_avg, true);
  exp_avg_sq_ = make(m.exp_avg_sq, true);
  if (amsgrad) max_exp_avg_sq_ = make(m.max_exp_avg_sq, true);
  bytes_ += 2 * numel_ * static_cast<std::int64_t>(c10::elementSize(dtype));  // the gradients and parameters moved
}

std::shared_ptr<offload::UpdateTicket> HostBucket::submit(offload::UpdateQueue& queue, const BucketUpdate& update,
                                                          const std::vector<bool>& has_gradient,
                                                          UpdateBuffers buffers) {
  STOWAGE_CHECK(has_gradient.size() == steps_.size(), has_gradient.size(), " gradient flags for a bucket of ",
                steps_.size(), " parameters");
  STOWAGE_CHECK(buffers.parameters != nullptr && buffers.gradients != nullptr, "an update without buffers");
  std::vector<offload::RunSlot> slots;
  std::vector<float> before;
  for (std::size_t i = 0; i < steps_.size(); ++i) {
    float* step = steps_[i].data_ptr<float>();
    before.push_back(*step);
    if (has_gradient[i]) *step += 1.0F;
    slots.push_back({offsets_[i], numels_[i], static_cast<std::int64_t>(*step), has_gradient[i]});
  }
  std::vector<offload::UpdateRun> runs = offload::update_runs(slots);
  if (runs.empty()) return nullptr;
  if (update.provisional) {
    saved_steps_ = std::move(before);
    memory_->undo_parameters = buffers.parameters;
  }
  const int threads = queue.threads();
  return queue.submit([memory = memory_, update, buffers = std::move(buffers), runs = std::move(runs), threads,
                       narrow = narrow_] {
    // Saved first: whatever ends the job, restore() gives back the states it began from.
    if (update.provisional) memory->save(buffers.parameters);
    // An update begun is finished: Ctrl-C does not end its waits (the step is made whole, Note
    // [Whole steps] in offload/slot_book.hpp); their deadlines do.
    const InterruptHold hold;
    for (const CopyMark& mark : buffers.waits) {
      wait_until([&] { return mark.done(); }, {"the copies of a bucket's gradients and parameters", mark.bytes});
    }
    for (const offload::UpdateRun& run : runs) memory->run(update, buffers, run, threads, narrow);
  });
}

bool HostBucket::restore() {
  if (!saved_steps_.has_value()) return false;
  const std::vector<void*> states = memory_->states(memory_->undo_parameters);
  for (std::size_t i = 0; i < states.size() && i < memory_->undo.size(); ++i) {
    std::memcpy(states[i], memory_->undo[i].data(), memory_->state_bytes);
  }
  for (std::size_t i = 0; i < steps_.size(); ++i) *steps_[i].data_ptr<float>() = (*saved_steps_)[i];
  saved_steps_.reset();
  return true;
}

ElementType element_type_of(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return ElementType::kFloat32;
    case at::kBFloat16: return ElementType::kBFloat16;
    case at::kHalf: return ElementType::kFloat16;
    default:
      STOWAGE_CHECK(false, "the offloaded optimizer updates float32, bfloat16 and float16 parameters, not ",
                    c10::toString(dtype));
      return ElementType::kFloat32;  // not reached
  }
}

}  // namespace stowage::torch_offload
