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

// Where one update reads and writes the bucket's states: written to `parameters`, `exp_avg`, ...;
// read from the `*_in` pointers (all null: in place, read where written).
struct HostBucket::SetPointers {
  void* parameters = nullptr;
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
  void* max_exp_avg_sq = nullptr;  // null without amsgrad
  const void* parameters_in = nullptr;
  const void* exp_avg_in = nullptr;
  const void* exp_avg_sq_in = nullptr;
  const void* max_exp_avg_sq_in = nullptr;
};

// The blocks behind the bucket's states (both sets). Update jobs hold it.
struct HostBucket::Memory {
  std::vector<std::shared_ptr<void>> blocks;
  ElementType dtype = ElementType::kFloat32;  // the parameters'
  std::size_t state_size = 4;                 // bytes of one state element

  void run(const BucketUpdate& update, const UpdateBuffers& buffers, const SetPointers& at,
           const offload::UpdateRun& run, int threads, bool narrow) const;
  // Elements [begin, end) of every state, copied from the set read to the set written.
  void copy(const SetPointers& at, std::int64_t begin, std::int64_t end) const {
    const auto offset = static_cast<std::size_t>(begin) * state_size;
    const auto bytes = static_cast<std::size_t>(end - begin) * state_size;
    const std::pair<void*, const void*> pairs[] = {{at.parameters, at.parameters_in},
                                                   {at.exp_avg, at.exp_avg_in},
                                                   {at.exp_avg_sq, at.exp_avg_sq_in},
                                                   {at.max_exp_avg_sq, at.max_exp_avg_sq_in}};
    for (const auto& [to, from] : pairs) {
      if (to == nullptr) continue;
      std::memcpy(static_cast<unsigned char*>(to) + offset, static_cast<const unsigned char*>(from) + offset, bytes);
    }
  }
};

namespace {

// Element `index` of `base` (null stays null: a state the update does not have, or reads in place).
const unsigned char* at_element(const void* base, std::int64_t index, std::size_t size) {
  return base == nullptr ? nullptr : static_cast<const unsigned char*>(base) + static_cast<std::size_t>(index) * size;
}

unsigned char* written_at(void* base, std::int64_t index, std::size_t size) {
  return base == nullptr ? nullptr : static_cast<unsigned char*>(base) + static_cast<std::size_t>(index) * size;
}

}  // namespace

void HostBucket::Memory::run(const BucketUpdate& update, const UpdateBuffers& buffers, const SetPointers& at,
                             const offload::UpdateRun& r, int threads, bool narrow) const {
  const std::size_t size = offload::element_size(dtype);
  const auto count = static_cast<std::size_t>(r.end - r.begin);
  const void* grad = at_element(buffers.gradients, r.begin, size);
  if (narrow) {
    offload::NarrowAdamBuffers b;
    b.param = written_at(at.parameters, r.begin, size);
    b.exp_avg = written_at(at.exp_avg, r.begin, size);
    b.exp_avg_sq = written_at(at.exp_avg_sq, r.begin, size);
    b.grad = grad;
    b.max_exp_avg_sq = written_at(at.max_exp_avg_sq, r.begin, size);
    b.type = dtype;
    b.count = count;
    b.sources = {at_element(at.parameters_in, r.begin, size), at_element(at.exp_avg_in, r.begin, size),
                 at_element(at.exp_avg_sq_in, r.begin, size), at_element(at.max_exp_avg_sq_in, r.begin, size)};
    offload::adam_step_narrow(update.hyper, r.step, b, threads);
    return;
  }
  const auto floats = [&](const void* base) {
    return reinterpret_cast<const float*>(at_element(base, r.begin, 4));
  };
  const auto writable = [&](void* base) { return reinterpret_cast<float*>(written_at(base, r.begin, 4)); };
  offload::AdamWBuffers b;
  b.master = writable(at.parameters);
  b.exp_avg = writable(at.exp_avg);
  b.exp_avg_sq = writable(at.exp_avg_sq);
  b.grad = grad;
  b.grad_type = dtype;
  if (buffers.output != nullptr) {
    b.out = written_at(buffers.output, r.begin, size);
    b.out_type = dtype;
  }
  b.max_exp_avg_sq = writable(at.max_exp_avg_sq);
  b.sources = {floats(at.parameters_in), floats(at.exp_avg_in), floats(at.exp_avg_sq_in), floats(at.max_exp_avg_sq_in)};
  b.count = count;
  offload::AdamWHyperparameters hyper = update.hyper;
  hyper.vector_sqrt = update.cpu_sqrt ? torch_vector_sqrt() : nullptr;
  offload::adamw_step(hyper, r.step, b, threads);
}

HostBucket::HostBucket(HostStateStore& store, at::ScalarType dtype, const std::vector<std::int64_t>& numels,
                       bool master_weights, bool amsgrad, bool provisional)
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
  m.state_size = c10::elementSize(state_type_);
  const auto state_bytes = static_cast<std::size_t>(numel_) * m.state_size;
  const auto make = [&](bool zero) {
    std::shared_ptr<void> block = store.allocate(state_bytes);
    m.blocks.push_back(block);
    at::Tensor tensor = HostStateStore::tensor_over(block, numel_, state_type_);
    bytes_ += static_cast<std::int64_t>(tensor.nbytes());
    state_bytes_ += static_cast<std::int64_t>(tensor.nbytes());
    if (zero) tensor.zero_();
    if (provisional) {
      spares_.push_back(std::make_unique<DoubleBuffer>(store, block, tensor));
      m.blocks.push_back(spares_.back()->blocks().back());
      state_bytes_ += spares_.back()->bytes();
    }
    return tensor;
  };
  if (state_type_ != dtype) {
    master_ = make(false);
    if (provisional) master_spare_ = spares_.back().get();
  }
  exp_avg_ = make(true);
  exp_avg_sq_ = make(true);
  if (amsgrad) max_exp_avg_sq_ = make(true);
  bytes_ += 2 * numel_ * static_cast<std::int64_t>(c10::elementSize(dtype));  // the gradients and parameters moved
}

HostBucket::SetPointers HostBucket::set_pointers(const UpdateBuffers& buffers, bool provisional) const {
  SetPointers at;
  const auto current = [](const at::Tensor& tensor) { return tensor.defined() ? tensor.data_ptr() : nullptr; };
  if (!provisional) {
    at.parameters = buffers.parameters;
    at.exp_avg = current(exp_avg_);
    at.exp_avg_sq = current(exp_avg_sq_);
    at.max_exp_avg_sq = current(max_exp_avg_sq_);
    return at;
  }
  STOWAGE_CHECK(!spares_.empty(), "a provisional update of a bucket made without a second set of states");
  DoubleBuffer* parameters = master_spare_ != nullptr ? master_spare_ : buffers.parameters_spare;
  STOWAGE_CHECK(parameters != nullptr && parameters->current_data() == buffers.parameters,
                "a provisional update's parameters have no second buffer");
  const std::size_t first = master_spare_ != nullptr ? 1 : 0;  // the moments' spares follow the master's
  at.parameters = parameters->spare_data();
  at.exp_avg = spares_[first]->spare_data();
  at.exp_avg_sq = spares_[first + 1]->spare_data();
  if (max_exp_avg_sq_.defined()) at.max_exp_avg_sq = spares_[first + 2]->spare_data();
  at.parameters_in = buffers.parameters;
  at.exp_avg_in = current(exp_avg_);
  at.exp_avg_sq_in = current(exp_avg_sq_);
  at.max_exp_avg_sq_in = current(max_exp_avg_sq_);
  return at;
}

std::shared_ptr<offload::UpdateTicket> HostBucket::submit(offload::UpdateQueue& queue, const BucketUpdate& update,
                                                          const std::vector<bool>& has_gradient,
                                                          UpdateBuffers buffers) {
  STOWAGE_CHECK(has_gradient.size() == steps_.size(), has_gradient.size(), " gradient flags for a bucket of ",
                steps_.size(), " parameters");
  STOWAGE_CHECK(buffers.parameters != nullptr && buffers.gradients != nullptr, "an update without buffers");
  STOWAGE_CHECK(!provisional_.has_value(), "a bucket's update submitted while its provisional one neither stood nor "
                "was undone");
  std::vector<offload::RunSlot> slots;
  std::vector<float> steps;
  for (std::size_t i = 0; i < steps_.size(); ++i) {
    steps.push_back(*steps_[i].data_ptr<float>() + (has_gradient[i] ? 1.0F : 0.0F));
    slots.push_back({offsets_[i], numels_[i], static_cast<std::int64_t>(steps.back()), has_gradient[i]});
  }
  std::vector<offload::UpdateRun> runs = offload::update_runs(slots);
  if (runs.empty()) return nullptr;
  const SetPointers at = set_pointers(buffers, update.provisional);
  // Out of place, the elements no run writes are copied into the second set: it becomes current whole.
  std::vector<offload::UpdateRun> copies;
  if (update.provisional) {
    std::int64_t begin = 0;
    for (const offload::UpdateRun& run : runs) {
      if (run.begin > begin) copies.push_back({begin, run.begin, 0});
      begin = run.end;
    }
    if (begin < numel_) copies.push_back({begin, numel_, 0});
    for (const offload::UpdateRun& copy : copies) {
      copied_bytes_ += (copy.end - copy.begin) * static_cast<std::int64_t>(memory_->state_size) *
                       (max_exp_avg_sq_.defined() ? 4 : 3);
    }
    Provisional waiting{std::move(steps), {}};
    for (const std::unique_ptr<DoubleBuffer>& spare : spares_) waiting.swapped.push_back(spare.get());
    if (master_spare_ == nullptr) waiting.swapped.push_back(buffers.parameters_spare);
    provisional_ = std::move(waiting);
    for (DoubleBuffer* swapped : provisional_->swapped) {
      for (const std::shared_ptr<void>& block : swapped->blocks()) buffers.held.push_back(block);
    }
  } else {
    for (std::size_t i = 0; i < steps_.size(); ++i) *steps_[i].data_ptr<float>() = steps[i];
  }
  const int threads = queue.threads();
  return queue.submit([memory = memory_, update, buffers = std::move(buffers), at, runs = std::move(runs),
                       copies = std::move(copies), threads, narrow = narrow_] {
    // An update begun is finished: Ctrl-C does not end its waits (the step is made whole, Note
    // [Whole steps] in offload/slot_book.hpp); their deadlines do.
    const InterruptHold hold;
    for (const CopyMark& mark : buffers.waits) {
      wait_until([&] { return mark.done(); }, {"the copies of a bucket's gradients and parameters", mark.bytes});
    }
    for (const offload::UpdateRun& copy : copies) memory->copy(at, copy.begin, copy.end);
    for (const offload::UpdateRun& run : runs) memory->run(update, buffers, at, run, threads, narrow);
  });
}

bool HostBucket::stand() {
  if (!provisional_.has_value()) return false;
  for (DoubleBuffer* swapped : provisional_->swapped) swapped->swap();
  for (std::size_t i = 0; i < steps_.size(); ++i) *steps_[i].data_ptr<float>() = provisional_->steps[i];
  provisional_.reset();
  return true;
}

bool HostBucket::restore() {
  if (!provisional_.has_value()) return false;
  provisional_.reset();
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
