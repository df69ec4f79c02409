#include "offload/adamw_kernel.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "base/errors.hpp"
#include "base/sanitizers.hpp"
#include "offload/range_workers.hpp"

namespace stowage::offload {
namespace {

// Elements per chunk of the path that hands its square roots to a vector function: the chunk's
// states (256 x 16 bytes, and its roots) stay in L1 between the moments, the square roots and
// the parameters. Measured on one core of the AMD EPYC of bench/results/2026-11-28-cpu-adamw.md
// with MKL's square root: 128 to 384 alike, 2,048 a quarter slower (its chunk leaves L1).
constexpr std::size_t kChunk = 256;
// Below this many elements a thread costs more to start than it saves.
constexpr std::size_t kMinPerThread = 1 << 16;

// The per-step scalars, computed once in double as torch does, then applied in float.
struct StepScalars {
  float keep;             // AdamW: 1 - lr * weight_decay (1 for Adam)
  float l2;               // Adam: weight_decay, the penalty added to the gradient (0 for AdamW)
  // torch's lerp of the first moment towards the gradient by w = 1 - beta1: from the moment by w
  // when w < 0.5 (then > 0), else from the gradient by w - 1 (then <= 0). (The sign says which:
  // GCC 12 leaves the update's loop scalar when it reads a bool from this struct.)
  float lerp_weight;
  float beta2;
  float one_minus_beta2;
  float step_size;        // lr / (1 - beta1^step)
  float bias2_sqrt;       // sqrt(1 - beta2^step)
  float eps;
  float grad_scale;       // applied to each gradient as it is read; negative to maximize
  VectorSqrt vector_sqrt; // the reference's square root, or null
};

StepScalars scalars_of(const AdamWHyperparameters& h, std::int64_t step) {
  const double bias1 = 1.0 - std::pow(h.beta1, static_cast<double>(step));
  const double bias2 = 1.0 - std::pow(h.beta2, static_cast<double>(step));
  const double decay = h.decoupled_weight_decay ? h.weight_decay : 0.0;
  const auto weight = static_cast<float>(1.0 - h.beta1);
  return {static_cast<float>(1.0 - h.lr * decay),
          static_cast<float>(h.decoupled_weight_decay ? 0.0 : h.weight_decay),
          weight < 0.5f ? weight : weight - 1.0f,
          static_cast<float>(h.beta2),
          static_cast<float>(1.0 - h.beta2),
          static_cast<float>(h.lr / bias1),
          static_cast<float>(std::sqrt(bias2)),
          static_cast<float>(h.eps),
          static_cast<float>(h.maximize ? -h.grad_scale : h.grad_scale),
          h.vector_sqrt};
}

// fp16 <-> fp32 in integer and float operations the compiler vectorises (GCC 12 leaves a loop
// that casts _Float16 scalar); the same bits as the F16C instructions (vcvtph2ps, and vcvtps2ph
// rounding to nearest even), checked over every half and every float.
[[gnu::always_inline]] inline float from_float16(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t magnitude = h & 0x7FFFu;
  // Normal, infinite and NaN: the exponent rebiased (all ones stays all ones), a NaN quieted.
  const std::uint32_t rebiased = (magnitude << 13) + (magnitude >= 0x7C00u ? (255u - 31u) << 23 : (127u - 15u) << 23);
  const std::uint32_t quieted = magnitude > 0x7C00u ? rebiased | 0x00400000u : rebiased;
  // Zero and subnormal: the mantissa times 2^-24, exact in float.
  const float subnormal = static_cast<float>(magnitude) * 0x1p-24f;
  return std::bit_cast<float>(sign | (magnitude < 0x0400u ? std::bit_cast<std::uint32_t>(subnormal) : quieted));
}

[[gnu::always_inline]] inline std::uint16_t to_float16(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t magnitude = bits & 0x7FFFFFFFu;
  // A normal half: the exponent rebiased, the dropped 13 bits rounded to nearest even.
  const std::uint32_t normal = (magnitude - ((127u - 15u) << 23) + 0x0FFFu + ((magnitude >> 13) & 1u)) >> 13;
  // A subnormal half (or zero): adding 0.5 leaves the value in 2^-24 steps in the low bits,
  // rounded to nearest even by the addition.
  const std::uint32_t subnormal = std::bit_cast<std::uint32_t>(std::bit_cast<float>(magnitude) + 0.5f) - 0x3F000000u;
  const std::uint32_t nan = 0x7E00u | ((magnitude >> 13) & 0x03FFu);  // quiet, the payload's top bits kept
  std::uint32_t half = magnitude < 0x38800000u ? subnormal : normal;  // below 2^-14
  half = magnitude >= 0x477FF000u ? 0x7C00u : half;                   // 65520 and up round to infinity
  half = magnitude > 0x7F800000u ? nan : half;
  return static_cast<std::uint16_t>(sign | half);
}

template <ElementType T>
[[gnu::always_inline]] inline float load(const void* base, std::size_t i) {
  if constexpr (T == ElementType::kFloat32) {
    return static_cast<const float*>(base)[i];
  } else if constexpr (T == ElementType::kBFloat16) {
    return std::bit_cast<float>(static_cast<std::uint32_t>(static_cast<const std::uint16_t*>(base)[i]) << 16);
  } else {
    return from_float16(static_cast<const std::uint16_t*>(base)[i]);
  }
}

[[gnu::always_inline]] inline std::uint16_t to_bfloat16(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);
  // NaN stays NaN (quiet): rounding must not carry it into infinity.
  const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<std::uint16_t>(nan ? ((bits >> 16) | 0x40u) : (rounded >> 16));
}

template <ElementType T>
[[gnu::always_inline]] inline void store(void* base, std::size_t i, float value) {
  if constexpr (T == ElementType::kFloat32) {
    static_cast<float*>(base)[i] = value;
  } else if constexpr (T == ElementType::kBFloat16) {
    static_cast<std::uint16_t*>(base)[i] = to_bfloat16(value);
  } else {
    static_cast<std::uint16_t*>(base)[i] = to_float16(value);
  }
}

// Note [torch's roundings]
// The update rounds where torch's AdamW on a CPU rounds (its single-tensor path, torch's default
// for CPU tensors; its foreach path gives the same bits): each op of torch's formula one
// rounding, in its order, a fused multiply-add where torch's vectorised kernels use one (lerp;
// addcmul; add with alpha), a division where torch divides, and the square root torch takes.
// torch's CPU sqrt of a float tensor is MKL's vector math (vmsSqrt, high-accuracy mode), which is
// not correctly rounded on every CPU: on the AMD EPYC of bench/results/2026-11-28-cpu-adamw.md it
// differs from the correctly rounded root in 17% of values, by an ulp. So the caller may hand
// that function in (AdamWHyperparameters::vector_sqrt; stowage's torch layer does for parameters
// on a CPU), and the kernel then takes its roots over whole chunks, one call each; without it the
// roots are the correctly rounded ones (std::sqrt, one vector instruction in a single pass), as
// torch's CUDA AdamW and its fused CPU AdamW take them. Parameters kept in their own precision
// follow torch's fused AdamW (an fp32 update, each state rounded as it is stored), the path that
// keeps fp16's eps; its one departure is amsgrad's maximum past its last whole vector, where it
// keeps the old maximum over a NaN moment (std::max) and the kernel takes NaN (torch.maximum).
// The file is compiled with -ffp-contract=off so that no other operations fuse.

// The gradient as the update takes it: scaled (negated to maximize) as it is read, then Adam's
// penalty. kL2 only where weight_decay is not 0, so that an infinite weight cannot turn a
// gradient into NaN through 0 * inf.
template <bool kL2>
[[gnu::always_inline]] inline float gradient(float raw, float master, const StepScalars& s) {
  const float g = raw * s.grad_scale;
  return kL2 ? std::fma(s.l2, master, g) : g;
}

// torch's lerp(m, g, 1 - beta1) as its vectorised kernel computes it: fma(w, g - m, m) for a
// small weight, fma(w - 1, g - m, g) otherwise.
[[gnu::always_inline]] inline float first_moment(float m, float g, const StepScalars& s) {
  return std::fma(s.lerp_weight, g - m, s.lerp_weight > 0.0f ? m : g);
}

// v * beta2, then addcmul(g, g, 1 - beta2): one fused multiply-add, as torch's.
[[gnu::always_inline]] inline float second_moment(float v, float g, const StepScalars& s) {
  return std::fma(s.one_minus_beta2 * g, g, v * s.beta2);
}

// The parameter after the step, from the square root of the second moment (or its maximum).
[[gnu::always_inline]] inline float stepped(float master, float m, float root, const StepScalars& s) {
  return master * s.keep - (s.step_size * m) / (root / s.bias2_sqrt + s.eps);
}

// The larger of the running maximum and the new second moment; NaN in either stays NaN, as
// torch.maximum keeps it.
[[gnu::always_inline]] inline float running_max(float seen, float now) {
  return (seen > now || seen != seen) ? seen : now;
}

// Elements [begin, end) in one pass, each square root correctly rounded (no vector function).
// Restrict-qualified so that the compiler vectorises without alias checks (AdamWBuffers' rule);
// `s` is copied so that no store through the buffers can be taken to change it.
template <ElementType G, ElementType O, bool kOut, bool kL2, bool kAmsgrad>
[[gnu::always_inline]] inline void update_in_one_pass(const StepScalars& scalars, const AdamWBuffers& b,
                                                      std::size_t begin, std::size_t end) {
  const StepScalars s = scalars;
  float* __restrict master = b.master;
  float* __restrict m = b.exp_avg;
  float* __restrict v = b.exp_avg_sq;
  float* __restrict v_max = b.max_exp_avg_sq;
  const void* grad = b.grad;
  void* out = b.out;
  for (std::size_t i = begin; i < end; ++i) {
    const float g = gradient<kL2>(load<G>(grad, i), master[i], s);
    const float m_new = first_moment(m[i], g, s);
    const float v_new = second_moment(v[i], g, s);
    m[i] = m_new;
    v[i] = v_new;
    float v_hat = v_new;
    if constexpr (kAmsgrad) {
      v_hat = running_max(v_max[i], v_new);
      v_max[i] = v_hat;
    }
    const float updated = stepped(master[i], m_new, std::sqrt(v_hat), s);
    master[i] = updated;
    if constexpr (kOut) store<O>(out, i, updated);
  }
}

// Elements [begin, end) with the square roots of s.vector_sqrt, in chunks: the moments, then the
// chunk's roots in one call, then the parameters and their output. The roots are taken straight
// from the stored second moments (or their maximum).
template <ElementType G, ElementType O, bool kOut, bool kL2, bool kAmsgrad>
[[gnu::always_inline]] inline void update_in_chunks(const StepScalars& scalars, const AdamWBuffers& b,
                                                    std::size_t begin, std::size_t end) {
  const StepScalars s = scalars;
  float* __restrict master = b.master;
  float* __restrict m = b.exp_avg;
  float* __restrict v = b.exp_avg_sq;
  float* __restrict v_max = b.max_exp_avg_sq;
  const void* grad = b.grad;
  void* out = b.out;
  const float* rooted = kAmsgrad ? v_max : v;
  alignas(64) float roots[kChunk];
  for (std::size_t start = begin; start < end; start += kChunk) {
    const std::size_t stop = std::min(end, start + kChunk);
    for (std::size_t i = start; i < stop; ++i) {
      const float g = gradient<kL2>(load<G>(grad, i), master[i], s);
      m[i] = first_moment(m[i], g, s);
      v[i] = second_moment(v[i], g, s);
      if constexpr (kAmsgrad) v_max[i] = running_max(v_max[i], v[i]);
    }
    s.vector_sqrt(static_cast<int>(stop - start), rooted + start, roots);
    for (std::size_t i = start; i < stop; ++i) {
      const float updated = stepped(master[i], m[i], roots[i - start], s);
      master[i] = updated;
      if constexpr (kOut) store<O>(out, i, updated);
    }
  }
}

template <ElementType G, ElementType O, bool kOut, bool kL2, bool kAmsgrad>
[[gnu::always_inline]] inline void update_range(const StepScalars& s, const AdamWBuffers& b, std::size_t begin,
                                                std::size_t end) {
  if (s.vector_sqrt == nullptr) return update_in_one_pass<G, O, kOut, kL2, kAmsgrad>(s, b, begin, end);
  update_in_chunks<G, O, kOut, kL2, kAmsgrad>(s, b, begin, end);
}

// The variant for the step's penalty and amsgrad, chosen once per range.
template <ElementType G, ElementType O, bool kOut>
[[gnu::always_inline]] inline void update_variant(const StepScalars& s, const AdamWBuffers& b, std::size_t begin,
                                                  std::size_t end) {
  const bool l2 = s.l2 != 0.0f;
  const bool amsgrad = b.max_exp_avg_sq != nullptr;
  if (l2 && amsgrad) return update_range<G, O, kOut, true, true>(s, b, begin, end);
  if (l2) return update_range<G, O, kOut, true, false>(s, b, begin, end);
  if (amsgrad) return update_range<G, O, kOut, false, true>(s, b, begin, end);
  update_range<G, O, kOut, false, false>(s, b, begin, end);
}

// One range of a parameter kept in its own precision T: every state read as fp32, updated, and
// rounded to T as it is stored (torch's fused Adam on bf16 / fp16 parameters).
template <ElementType T, bool kL2, bool kAmsgrad>
[[gnu::always_inline]] inline void narrow_range(const StepScalars& scalars, const NarrowAdamBuffers& b,
                                                std::size_t begin, std::size_t end) {
  // Locals, restrict-qualified, as update_in_one_pass's.
  const StepScalars s = scalars;
  std::uint16_t* __restrict param = static_cast<std::uint16_t*>(b.param);
  std::uint16_t* __restrict m = static_cast<std::uint16_t*>(b.exp_avg);
  std::uint16_t* __restrict v = static_cast<std::uint16_t*>(b.exp_avg_sq);
  std::uint16_t* __restrict v_max = static_cast<std::uint16_t*>(b.max_exp_avg_sq);
  const std::uint16_t* __restrict grad = static_cast<const std::uint16_t*>(b.grad);
  for (std::size_t i = begin; i < end; ++i) {
    const float p0 = load<T>(param, i);
    const float g = gradient<kL2>(load<T>(grad, i), p0, s);
    const float m_new = first_moment(load<T>(m, i), g, s);
    const float v_new = second_moment(load<T>(v, i), g, s);
    store<T>(m, i, m_new);
    store<T>(v, i, v_new);
    float v_hat = v_new;
    if constexpr (kAmsgrad) {
      v_hat = running_max(load<T>(v_max, i), v_new);
      store<T>(v_max, i, v_hat);
    }
    store<T>(param, i, stepped(p0, m_new, std::sqrt(v_hat), s));
  }
}

template <ElementType T>
[[gnu::always_inline]] inline void narrow_variant(const StepScalars& s, const NarrowAdamBuffers& b, std::size_t begin,
                                                  std::size_t end) {
  const bool l2 = s.l2 != 0.0f;
  const bool amsgrad = b.max_exp_avg_sq != nullptr;
  if (l2 && amsgrad) return narrow_range<T, true, true>(s, b, begin, end);
  if (l2) return narrow_range<T, true, false>(s, b, begin, end);
  if (amsgrad) return narrow_range<T, false, true>(s, b, begin, end);
  narrow_range<T, false, false>(s, b, begin, end);
}

using NarrowFunction = void (*)(const StepScalars&, const NarrowAdamBuffers&, std::size_t, std::size_t);

using RangeFunction = void (*)(const StepScalars&, const AdamWBuffers&, std::size_t, std::size_t);

// One function per (gradient, output) pair, each compiled for AVX-512, AVX2/FMA/F16C and the baseline;
// the loader picks the best the CPU has. Its resolver (an ifunc) runs before ThreadSanitizer's
// runtime is up and crashes it, so a TSan build (either compiler: sanitizers.hpp) keeps the
// baseline alone.
#if defined(STOWAGE_THREAD_SANITIZER)
#define STOWAGE_ADAMW_CLONES
#else
#define STOWAGE_ADAMW_CLONES [[gnu::target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")]]
#endif
#define STOWAGE_ADAMW_RANGE(name, G, O, OUT)                                                          \
  STOWAGE_ADAMW_CLONES void name(                                                                    \
      const StepScalars& s, const AdamWBuffers& b, std::size_t begin, std::size_t end) {             \
    update_variant<ElementType::G, ElementType::O, OUT>(s, b, begin, end);                             \
  }
STOWAGE_ADAMW_RANGE(range_f32_none, kFloat32, kFloat32, false)
STOWAGE_ADAMW_RANGE(range_bf16_none, kBFloat16, kFloat32, false)
STOWAGE_ADAMW_RANGE(range_f16_none, kFloat16, kFloat32, false)
STOWAGE_ADAMW_RANGE(range_f32_f32, kFloat32, kFloat32, true)
STOWAGE_ADAMW_RANGE(range_f32_bf16, kFloat32, kBFloat16, true)
STOWAGE_ADAMW_RANGE(range_f32_f16, kFloat32, kFloat16, true)
STOWAGE_ADAMW_RANGE(range_bf16_f32, kBFloat16, kFloat32, true)
STOWAGE_ADAMW_RANGE(range_bf16_bf16, kBFloat16, kBFloat16, true)
STOWAGE_ADAMW_RANGE(range_bf16_f16, kBFloat16, kFloat16, true)
STOWAGE_ADAMW_RANGE(range_f16_f32, kFloat16, kFloat32, true)
STOWAGE_ADAMW_RANGE(range_f16_bf16, kFloat16, kBFloat16, true)
STOWAGE_ADAMW_RANGE(range_f16_f16, kFloat16, kFloat16, true)
#undef STOWAGE_ADAMW_RANGE
STOWAGE_ADAMW_CLONES void narrow_bf16(const StepScalars& s, const NarrowAdamBuffers& b, std::size_t begin,
                                      std::size_t end) {
  narrow_variant<ElementType::kBFloat16>(s, b, begin, end);
}
STOWAGE_ADAMW_CLONES void narrow_f16(const StepScalars& s, const NarrowAdamBuffers& b, std::size_t begin,
                                     std::size_t end) {
  narrow_variant<ElementType::kFloat16>(s, b, begin, end);
}
#undef STOWAGE_ADAMW_CLONES

RangeFunction range_function(const AdamWBuffers& b) {
  static constexpr RangeFunction kNoOut[] = {range_f32_none, range_bf16_none, range_f16_none};
  static constexpr RangeFunction kWithOut[3][3] = {{range_f32_f32, range_f32_bf16, range_f32_f16},
                                                    {range_bf16_f32, range_bf16_bf16, range_bf16_f16},
                                                    {range_f16_f32, range_f16_bf16, range_f16_f16}};
  const auto grad = static_cast<std::size_t>(b.grad_type);
  if (b.out == nullptr) return kNoOut[grad];
  return kWithOut[grad][static_cast<std::size_t>(b.out_type)];
}

void check_buffers(const AdamWHyperparameters& hyper, std::int64_t step, const AdamWBuffers& b) {
  STOWAGE_CHECK(step >= 1, "AdamW step must count from 1, not ", step);
  STOWAGE_CHECK(hyper.beta1 >= 0 && hyper.beta1 < 1 && hyper.beta2 >= 0 && hyper.beta2 < 1,
                "AdamW betas must lie in [0, 1), not (", hyper.beta1, ", ", hyper.beta2, ")");
  STOWAGE_CHECK(std::isfinite(hyper.grad_scale), "AdamW gradient scale must be finite, not ", hyper.grad_scale);
  STOWAGE_CHECK(b.count == 0 || (b.master && b.exp_avg && b.exp_avg_sq && b.grad),
                "AdamW buffers of ", b.count, " elements need master, moments and gradient");
  STOWAGE_CHECK(static_cast<std::size_t>(b.grad_type) < 3 && static_cast<std::size_t>(b.out_type) < 3,
                "unknown element type");
  const AdamWSources& in = b.sources;
  const bool out_of_place = in.master != nullptr;
  const bool moments = (in.exp_avg != nullptr) == out_of_place && (in.exp_avg_sq != nullptr) == out_of_place;
  const bool maximum = (in.max_exp_avg_sq != nullptr) == (out_of_place && b.max_exp_avg_sq != nullptr);
  STOWAGE_CHECK(b.count == 0 || (moments && maximum),
                "AdamW sources must be all set (out of place) or all null (in place)");
}

// The narrow sources as AdamWSources, for the checks the two share.
AdamWSources as_sources(const NarrowAdamSources& in) {
  return {static_cast<const float*>(in.param), static_cast<const float*>(in.exp_avg),
          static_cast<const float*>(in.exp_avg_sq), static_cast<const float*>(in.max_exp_avg_sq)};
}

void check_narrow(const AdamWHyperparameters& hyper, std::int64_t step, const NarrowAdamBuffers& b) {
  check_buffers(hyper, step, {static_cast<float*>(b.param), static_cast<float*>(b.exp_avg),
                              static_cast<float*>(b.exp_avg_sq), b.grad, b.type, nullptr, b.type, b.count,
                              static_cast<float*>(b.max_exp_avg_sq), as_sources(b.sources)});
  STOWAGE_CHECK(b.type == ElementType::kBFloat16 || b.type == ElementType::kFloat16,
                "parameters kept in their own precision are bfloat16 or float16");
}

}  // namespace

std::size_t element_size(ElementType type) noexcept { return type == ElementType::kFloat32 ? 4 : 2; }

AdamWBuffers slice(const AdamWBuffers& b, std::size_t begin, std::size_t end) {
  STOWAGE_CHECK(begin <= end && end <= b.count, "slice [", begin, ", ", end, ") of AdamW buffers of ", b.count,
                " elements");
  AdamWBuffers out = b;
  out.master = b.master + begin;
  out.exp_avg = b.exp_avg + begin;
  out.exp_avg_sq = b.exp_avg_sq + begin;
  out.grad = static_cast<const unsigned char*>(b.grad) + begin * element_size(b.grad_type);
  if (b.out != nullptr) out.out = static_cast<unsigned char*>(b.out) + begin * element_size(b.out_type);
  if (b.max_exp_avg_sq != nullptr) out.max_exp_avg_sq = b.max_exp_avg_sq + begin;
  const auto from = [begin](const float* source) { return source == nullptr ? nullptr : source + begin; };
  out.sources = {from(b.sources.master), from(b.sources.exp_avg), from(b.sources.exp_avg_sq),
                 from(b.sources.max_exp_avg_sq)};
  out.count = end - begin;
  return out;
}

float bfloat16_to_float(std::uint16_t bits) noexcept { return load<ElementType::kBFloat16>(&bits, 0); }

std::uint16_t float_to_bfloat16(float value) noexcept { return to_bfloat16(value); }

float float16_to_float(std::uint16_t bits) noexcept { return from_float16(bits); }

std::uint16_t float_to_float16(float value) noexcept { return to_float16(value); }

namespace {

// Runs `run` over [0, count) split into `threads` contiguous shares (the caller's thread one of them).
template <typename Run>
void split_over_threads(std::size_t count, int threads, const Run& run) {
  const std::size_t useful = std::max<std::size_t>(1, count / kMinPerThread);
  const std::size_t parts = std::clamp<std::size_t>(static_cast<std::size_t>(std::max(threads, 1)), 1, useful);
  if (parts == 1) {
    run(0, count);
    return;
  }
  // Contiguous shares rounded to whole cache lines of fp32, so threads never share one.
  const std::size_t share = (count / parts + 15) / 16 * 16;
  RangeWorkers::shared().run(parts, [&](std::size_t part) {
    const std::size_t begin = std::min(count, part * share);
    const std::size_t end = part + 1 == parts ? count : std::min(count, begin + share);
    run(begin, end);
  });
}

// Note [Out-of-place updates]
// An update written out of place (AdamWSources) runs the in-place code over its buffers a chunk at
// a time, each chunk's states first copied in from the sources, a chunk small enough to stay in L1
// from the copy to the update: the sources are read once and the buffers written once (each
// buffer line read for ownership before it is written, as any store to memory out of cache: about
// 1.5x the state traffic of an in-place update, where copying the states aside first is 2x), and
// the results are the in-place ones bit for bit by construction. (GCC 12 leaves scalar, about 12x
// slower, the update loop that reads the states through one pointer and writes them through
// another; a scratch chunk streamed out with non-temporal stores, which would skip the reads for
// ownership, was slower than this on the development machine's AMD EPYC.)
constexpr std::size_t kCopiedChunk = 1024;

// `update(begin, end)` over [begin, end) in chunks, each after `copy(begin, end)`.
template <typename Copy, typename Update>
void chunk_by_chunk(std::size_t begin, std::size_t end, const Copy& copy, const Update& update) {
  for (std::size_t start = begin; start < end; start += kCopiedChunk) {
    const std::size_t stop = std::min(end, start + kCopiedChunk);
    copy(start, stop);
    update(start, stop);
  }
}

// Elements [begin, end) of `size`-byte elements from `source` to `buffer` (nothing where null).
void copy_elements(void* buffer, const void* source, std::size_t size, std::size_t begin, std::size_t end) {
  if (source == nullptr) return;
  std::memcpy(static_cast<unsigned char*>(buffer) + begin * size,
              static_cast<const unsigned char*>(source) + begin * size, (end - begin) * size);
}

}  // namespace

void adamw_step(const AdamWHyperparameters& hyper, std::int64_t step, const AdamWBuffers& buffers, int threads) {
  check_buffers(hyper, step, buffers);
  const StepScalars s = scalars_of(hyper, step);
  const RangeFunction run = range_function(buffers);
  const AdamWSources& in = buffers.sources;
  if (in.master == nullptr) {
    return split_over_threads(buffers.count, threads,
                              [&](std::size_t begin, std::size_t end) { run(s, buffers, begin, end); });
  }
  const auto copy = [&](std::size_t begin, std::size_t end) {
    copy_elements(buffers.master, in.master, 4, begin, end);
    copy_elements(buffers.exp_avg, in.exp_avg, 4, begin, end);
    copy_elements(buffers.exp_avg_sq, in.exp_avg_sq, 4, begin, end);
    copy_elements(buffers.max_exp_avg_sq, in.max_exp_avg_sq, 4, begin, end);
  };
  split_over_threads(buffers.count, threads, [&](std::size_t begin, std::size_t end) {
    chunk_by_chunk(begin, end, copy, [&](std::size_t start, std::size_t stop) { run(s, buffers, start, stop); });
  });
}

void adam_step_narrow(const AdamWHyperparameters& hyper, std::int64_t step, const NarrowAdamBuffers& buffers,
                      int threads) {
  check_narrow(hyper, step, buffers);
  const StepScalars s = scalars_of(hyper, step);
  const NarrowFunction run = buffers.type == ElementType::kBFloat16 ? narrow_bf16 : narrow_f16;
  const NarrowAdamSources& in = buffers.sources;
  if (in.param == nullptr) {
    return split_over_threads(buffers.count, threads,
                              [&](std::size_t begin, std::size_t end) { run(s, buffers, begin, end); });
  }
  const auto copy = [&](std::size_t begin, std::size_t end) {
    copy_elements(buffers.param, in.param, 2, begin, end);
    copy_elements(buffers.exp_avg, in.exp_avg, 2, begin, end);
    copy_elements(buffers.exp_avg_sq, in.exp_avg_sq, 2, begin, end);
    copy_elements(buffers.max_exp_avg_sq, in.max_exp_avg_sq, 2, begin, end);
  };
  split_over_threads(buffers.count, threads, [&](std::size_t begin, std::size_t end) {
    chunk_by_chunk(begin, end, copy, [&](std::size_t start, std::size_t stop) { run(s, buffers, start, stop); });
  });
}

void adam_step_narrow_reference(const AdamWHyperparameters& hyper, std::int64_t step, const NarrowAdamBuffers& b) {
  check_narrow(hyper, step, b);
  const double bias1 = 1.0 - std::pow(hyper.beta1, static_cast<double>(step));
  const double bias2 = 1.0 - std::pow(hyper.beta2, static_cast<double>(step));
  const bool bf16 = b.type == ElementType::kBFloat16;
  const auto get = [&](const void* base, std::size_t i) -> double {
    return bf16 ? load<ElementType::kBFloat16>(base, i) : load<ElementType::kFloat16>(base, i);
  };
  const auto put = [&](void* base, std::size_t i, double value) {
    if (bf16) store<ElementType::kBFloat16>(base, i, static_cast<float>(value));
    else store<ElementType::kFloat16>(base, i, static_cast<float>(value));
  };
  const NarrowAdamSources& in = b.sources;
  const bool apart = in.param != nullptr;  // out of place: the states read from the sources
  for (std::size_t i = 0; i < b.count; ++i) {
    double g = get(b.grad, i) * static_cast<double>(static_cast<float>(hyper.maximize ? -hyper.grad_scale
                                                                                        : hyper.grad_scale));
    const double p0 = get(apart ? in.param : b.param, i);
    if (!hyper.decoupled_weight_decay) g += hyper.weight_decay * p0;
    const double decay = hyper.decoupled_weight_decay ? hyper.weight_decay : 0.0;
    const double m = hyper.beta1 * get(apart ? in.exp_avg : b.exp_avg, i) + (1.0 - hyper.beta1) * g;
    const double v_before = get(apart ? in.exp_avg_sq : b.exp_avg_sq, i);
    const double v = hyper.beta2 * v_before + (1.0 - hyper.beta2) * g * g;
    put(b.exp_avg, i, m);
    put(b.exp_avg_sq, i, v);
    double v_hat = v;
    if (b.max_exp_avg_sq != nullptr) {
      v_hat = std::max(get(apart ? in.max_exp_avg_sq : b.max_exp_avg_sq, i), v);
      put(b.max_exp_avg_sq, i, v_hat);
    }
    put(b.param, i, p0 * (1.0 - hyper.lr * decay) - hyper.lr / bias1 * m / (std::sqrt(v_hat) / std::sqrt(bias2) + hyper.eps));
  }
}

void adamw_step_reference(const AdamWHyperparameters& hyper, std::int64_t step, const AdamWBuffers& b) {
  check_buffers(hyper, step, b);
  const double bias1 = 1.0 - std::pow(hyper.beta1, static_cast<double>(step));
  const double bias2 = 1.0 - std::pow(hyper.beta2, static_cast<double>(step));
  const AdamWSources& in = b.sources;
  const bool apart = in.master != nullptr;  // out of place: the states read from the sources
  for (std::size_t i = 0; i < b.count; ++i) {
    const float master = apart ? in.master[i] : b.master[i];
    const float exp_avg = apart ? in.exp_avg[i] : b.exp_avg[i];
    const float exp_avg_sq = apart ? in.exp_avg_sq[i] : b.exp_avg_sq[i];
    double g = 0;
    switch (b.grad_type) {
      case ElementType::kFloat32: g = load<ElementType::kFloat32>(b.grad, i); break;
      case ElementType::kBFloat16: g = load<ElementType::kBFloat16>(b.grad, i); break;
      case ElementType::kFloat16: g = load<ElementType::kFloat16>(b.grad, i); break;
    }
    g *= static_cast<double>(static_cast<float>(hyper.maximize ? -hyper.grad_scale : hyper.grad_scale));
    const double decay = hyper.decoupled_weight_decay ? hyper.weight_decay : 0.0;
    if (!hyper.decoupled_weight_decay) g += hyper.weight_decay * master;
    const double p = master * (1.0 - hyper.lr * decay);
    const double m = hyper.beta1 * exp_avg + (1.0 - hyper.beta1) * g;
    const double v = hyper.beta2 * exp_avg_sq + (1.0 - hyper.beta2) * g * g;
    b.exp_avg[i] = static_cast<float>(m);
    b.exp_avg_sq[i] = static_cast<float>(v);
    double v_hat = v;
    if (b.max_exp_avg_sq != nullptr) {
      b.max_exp_avg_sq[i] = std::max(apart ? in.max_exp_avg_sq[i] : b.max_exp_avg_sq[i], static_cast<float>(v));
      v_hat = b.max_exp_avg_sq[i];
    }
    b.master[i] = static_cast<float>(p - hyper.lr / bias1 * m / (std::sqrt(v_hat) / std::sqrt(bias2) + hyper.eps));
    if (b.out == nullptr) continue;
    switch (b.out_type) {
      case ElementType::kFloat32: store<ElementType::kFloat32>(b.out, i, b.master[i]); break;
      case ElementType::kBFloat16: store<ElementType::kBFloat16>(b.out, i, b.master[i]); break;
      case ElementType::kFloat16: store<ElementType::kFloat16>(b.out, i, b.master[i]); break;
    }
  }
}

}  // namespace stowage::offload
