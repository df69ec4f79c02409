// The host half of the offloaded optimizer: torch.optim.Adam's update (AdamW's decoupled weight
// decay or Adam's L2 penalty, maximize, amsgrad) over fp32 master weights and moments in one pass,
// gradients read in bf16, fp16 or fp32, and the updated parameters written in the device's
// precision for the copy back. One pass over the 28 bytes a parameter the job must touch (master,
// two moments, gradient in, parameter out; amsgrad adds its maximum), in chunks small enough that
// the update and the output conversion share the cache.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stowage::offload {

enum class ElementType : std::uint8_t { kFloat32, kBFloat16, kFloat16 };

[[nodiscard]] std::size_t element_size(ElementType type) noexcept;

// Square roots of `count` floats, `in` to `out` (may be the same): the reference optimizer's own
// (Note [torch's roundings] in adamw_kernel.cpp).
using VectorSqrt = void (*)(int count, const float* in, float* out);

struct AdamWHyperparameters {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  // Multiplies each gradient as it is read: 1 / the loss scale, times the clipping coefficient,
  // so that neither needs a pass of its own over the gradients.
  double grad_scale = 1.0;
  // true: AdamW's decay, the weights shrunk by lr * weight_decay; false: Adam's L2 penalty,
  // weight_decay * weight added to the gradient before the moments take it (torch's order:
  // unscaled, negated for maximize, then the penalty).
  bool decoupled_weight_decay = true;
  // Ascends the objective: the gradient is negated as it is read (torch's maximize).
  bool maximize = false;
  // The square root to take, as the optimizer matched rounds it; null: std::sqrt.
  VectorSqrt vector_sqrt = nullptr;
};

// Where an update written out of place reads the states it updates (Note [Provisional updates out
// of place] in python/tensors/host_bucket.hpp): all null, it reads them from the buffers it writes
// (in place); all set (max_exp_avg_sq with amsgrad alone), it reads them here and writes its
// results to the buffers, bit for bit the in-place results, the sources left unchanged. Sources
// must not overlap the buffers.
struct AdamWSources {
  const float* master = nullptr;
  const float* exp_avg = nullptr;
  const float* exp_avg_sq = nullptr;
  const float* max_exp_avg_sq = nullptr;
};

// One tensor's (or one bucket's) buffers, all `count` elements long. The fp32 buffers are updated
// in place, or written from `sources`; `out` (may be null: no output) receives the updated
// parameters converted to `out_type`, rounded to nearest even. Buffers may be unaligned; `out`
// must not overlap the rest.
struct AdamWBuffers {
  float* master = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  const void* grad = nullptr;
  ElementType grad_type = ElementType::kFloat32;
  void* out = nullptr;
  ElementType out_type = ElementType::kFloat32;
  std::size_t count = 0;
  // amsgrad: the largest second moment seen, updated in place; null without amsgrad.
  float* max_exp_avg_sq = nullptr;
  AdamWSources sources{};  // all null: in place
};

// Elements [begin, end) of `buffers`, for callers that split the work themselves.
[[nodiscard]] AdamWBuffers slice(const AdamWBuffers& buffers, std::size_t begin, std::size_t end);

// `step` counts from 1, as torch's state["step"] after its increment. Splits the buffers over
// `threads` threads (the caller's included; at least one). Thread-safe for disjoint buffers.
void adamw_step(const AdamWHyperparameters& hyper, std::int64_t step, const AdamWBuffers& buffers,
                int threads = 1);

// The same update one element at a time, in double where torch computes scalars in double: the
// reference the vectorised kernel is tested against.
void adamw_step_reference(const AdamWHyperparameters& hyper, std::int64_t step, const AdamWBuffers& buffers);

// A parameter kept in its own precision, bf16 or fp16, with its moments in that precision too:
// what torch's Adam holds for such a parameter (no fp32 master). The update runs in fp32 and
// rounds each state as it is stored, as torch's fused Adam does; the parameter is updated in
// place (or written from `sources`, as AdamWSources), and is what is written back.
struct NarrowAdamSources {
  const void* param = nullptr;
  const void* exp_avg = nullptr;
  const void* exp_avg_sq = nullptr;
  const void* max_exp_avg_sq = nullptr;
};

struct NarrowAdamBuffers {
  void* param = nullptr;
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
  const void* grad = nullptr;       // in the parameter's precision
  void* max_exp_avg_sq = nullptr;   // amsgrad; null without
  ElementType type = ElementType::kBFloat16;  // kBFloat16 or kFloat16
  std::size_t count = 0;
  NarrowAdamSources sources{};  // all null: in place
};

// As adamw_step, for parameters kept in their own precision.
void adam_step_narrow(const AdamWHyperparameters& hyper, std::int64_t step, const NarrowAdamBuffers& buffers,
                      int threads = 1);
// Element by element, in double, each state rounded as it is stored: the reference.
void adam_step_narrow_reference(const AdamWHyperparameters& hyper, std::int64_t step,
                                const NarrowAdamBuffers& buffers);

// Precision conversions the kernel uses, exposed for tests.
[[nodiscard]] float bfloat16_to_float(std::uint16_t bits) noexcept;
[[nodiscard]] std::uint16_t float_to_bfloat16(float value) noexcept;
[[nodiscard]] float float16_to_float(std::uint16_t bits) noexcept;
[[nodiscard]] std::uint16_t float_to_float16(float value) noexcept;

}  // namespace stowage::offload
