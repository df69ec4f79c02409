// The offloaded optimizer's host kernel against its element-by-element reference, for every
// gradient and output precision, on sizes with odd tails and unaligned starts, and split over
// threads.
#include "offload/adamw_kernel.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/errors.hpp"

namespace stowage::offload {
namespace {

struct State {
  std::vector<float> master, m, v;
  std::vector<unsigned char> grad, out;
};

State random_state(std::size_t count, ElementType grad_type, ElementType out_type, std::mt19937& random) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  State s;
  s.master.resize(count + 1);
  s.m.resize(count + 1);
  s.v.resize(count + 1);
  for (std::size_t i = 0; i <= count; ++i) {
    s.master[i] = normal(random);
    s.m[i] = 0.1f * normal(random);
    s.v[i] = 0.01f * std::abs(normal(random));
  }
  s.grad.resize((count + 1) * element_size(grad_type));
  for (std::size_t i = 0; i <= count; ++i) {
    const float g = normal(random);
    if (grad_type == ElementType::kFloat32) std::memcpy(&s.grad[i * 4], &g, 4);
    if (grad_type == ElementType::kBFloat16) {
      const std::uint16_t bits = float_to_bfloat16(g);
      std::memcpy(&s.grad[i * 2], &bits, 2);
    }
    if (grad_type == ElementType::kFloat16) {
      const auto half = static_cast<_Float16>(g);
      std::memcpy(&s.grad[i * 2], &half, 2);
    }
  }
  s.out.assign((count + 1) * element_size(out_type), 0);
  return s;
}

// Buffers over `state` starting at element `offset` (1: every pointer unaligned for SIMD).
AdamWBuffers buffers_of(State& s, std::size_t offset, std::size_t count, ElementType grad_type,
                        ElementType out_type, bool with_out) {
  return {s.master.data() + offset, s.m.data() + offset, s.v.data() + offset,
          s.grad.data() + offset * element_size(grad_type), grad_type,
          with_out ? s.out.data() + offset * element_size(out_type) : nullptr, out_type, count};
}

float out_value(const State& s, std::size_t i, ElementType type) {
  if (type == ElementType::kFloat32) {
    float value;
    std::memcpy(&value, &s.out[i * 4], 4);
    return value;
  }
  std::uint16_t bits;
  std::memcpy(&bits, &s.out[i * 2], 2);
  if (type == ElementType::kBFloat16) return bfloat16_to_float(bits);
  _Float16 half;
  std::memcpy(&half, &bits, 2);
  return static_cast<float>(half);
}

void expect_close(float actual, float expected, const char* what, std::size_t i) {
  ASSERT_NEAR(actual, expected, 2e-6f * std::abs(expected) + 1e-7f) << what << " at " << i;
}

constexpr ElementType kTypes[] = {ElementType::kFloat32, ElementType::kBFloat16, ElementType::kFloat16};

TEST(AdamWKernel, MatchesTheReferenceForEveryPrecisionSizeAndAlignment) {
  std::mt19937 random(7);
  const AdamWHyperparameters hyper{1e-3, 0.9, 0.999, 1e-8, 0.01, 0.37};
  for (const ElementType grad_type : kTypes) {
    for (const ElementType out_type : kTypes) {
      for (const bool with_out : {false, true}) {
        for (const std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{2047}, std::size_t{2049},
                                        std::size_t{70001}}) {
          for (const std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
            State fast = random_state(count, grad_type, out_type, random);
            State slow = fast;
            for (std::int64_t step = 1; step <= 3; ++step) {
              adamw_step(hyper, step, buffers_of(fast, offset, count, grad_type, out_type, with_out));
              adamw_step_reference(hyper, step, buffers_of(slow, offset, count, grad_type, out_type, with_out));
            }
            for (std::size_t i = offset; i < offset + count; ++i) {
              expect_close(fast.master[i], slow.master[i], "master", i);
              expect_close(fast.m[i], slow.m[i], "exp_avg", i);
              expect_close(fast.v[i], slow.v[i], "exp_avg_sq", i);
              if (!with_out) continue;
              // The outputs round the masters: at most one step of the output's precision apart.
              const float ulp = out_type == ElementType::kFloat32 ? 0 : out_type == ElementType::kBFloat16 ? 0x1p-7f
                                                                                                            : 0x1p-10f;
              ASSERT_NEAR(out_value(fast, i, out_type), out_value(slow, i, out_type),
                          ulp * std::abs(slow.master[i]) + 2e-6f * std::abs(slow.master[i]) + 1e-7f) << i;
            }
            // Nothing outside the range is touched.
            const std::size_t outside = offset == 0 ? count : 0;
            EXPECT_EQ(fast.master[outside], slow.master[outside]);
          }
        }
      }
    }
  }
}

// Adam's L2 penalty, maximize and amsgrad against the reference, on sizes with tails, unaligned.
TEST(AdamWKernel, EveryVariantOfTheUpdateMatchesTheReference) {
  std::mt19937 random(13);
  for (const bool decoupled : {true, false}) {
    for (const bool maximize : {false, true}) {
      for (const bool amsgrad : {false, true}) {
        AdamWHyperparameters hyper{1e-3, 0.9, 0.999, 1e-8, 0.05, 0.5};
        hyper.decoupled_weight_decay = decoupled;
        hyper.maximize = maximize;
        for (const std::size_t count : {std::size_t{5}, std::size_t{2049}, std::size_t{70001}}) {
          State fast = random_state(count, ElementType::kBFloat16, ElementType::kBFloat16, random);
          State slow = fast;
          std::vector<float> fast_max(count + 1, 0.0f), slow_max(count + 1, 0.0f);
          for (std::int64_t step = 1; step <= 4; ++step) {
            AdamWBuffers a = buffers_of(fast, 1, count, ElementType::kBFloat16, ElementType::kBFloat16, true);
            AdamWBuffers b = buffers_of(slow, 1, count, ElementType::kBFloat16, ElementType::kBFloat16, true);
            if (amsgrad) {
              a.max_exp_avg_sq = fast_max.data() + 1;
              b.max_exp_avg_sq = slow_max.data() + 1;
            }
            adamw_step(hyper, step, a, step % 2 == 0 ? 3 : 1);
            adamw_step_reference(hyper, step, b);
          }
          for (std::size_t i = 1; i <= count; ++i) {
            expect_close(fast.master[i], slow.master[i], "master", i);
            expect_close(fast.m[i], slow.m[i], "exp_avg", i);
            expect_close(fast.v[i], slow.v[i], "exp_avg_sq", i);
            expect_close(fast_max[i], slow_max[i], "max_exp_avg_sq", i);
          }
          EXPECT_EQ(fast_max[0], 0.0f);  // nothing before the range is touched
        }
      }
    }
  }
}

// The kernel's two paths, one pass with the correctly rounded root and chunks whose roots a
// vector function takes, give the same bits when that function is the correctly rounded root:
// random sizes (no multiple of a vector), unaligned starts, every precision and option, values
// at the edges of float (zeros, denormals, infinities, NaN), one thread and several.
void correctly_rounded_roots(int count, const float* in, float* out) {
  for (int i = 0; i < count; ++i) out[i] = std::sqrt(in[i]);
}

TEST(AdamWKernel, TheChunkedPathGivesTheOnePassBitsWhenHandedTheSameRoot) {
  std::mt19937 random(23);
  const float edges[] = {0.0f, -0.0f, 1e-40f, -1e-40f, 1e-45f, 3e38f, -3e38f, INFINITY, -INFINITY, NAN, 1e-20f};
  std::uniform_int_distribution<std::size_t> size_of(1, 9000), edge_of(0, std::size(edges) - 1);
  for (int round = 0; round < 48; ++round) {
    const ElementType grad_type = kTypes[round % 3];
    const ElementType out_type = kTypes[(round / 3) % 3];
    const std::size_t count = round == 0 ? 150001 : size_of(random);
    State one_pass = random_state(count, grad_type, out_type, random);
    for (std::size_t i = 0; i < count; i += 7) {  // every seventh state an edge value
      one_pass.master[i] = edges[edge_of(random)];
      one_pass.m[i + 1] = edges[edge_of(random)];
      one_pass.v[i] = std::abs(edges[edge_of(random)]);
    }
    State chunked = one_pass;
    std::vector<float> max_one(count + 1, 0.5f), max_chunked(count + 1, 0.5f);
    AdamWHyperparameters hyper{round % 5 == 0 ? 0.5 : 1e-3, round % 4 == 0 ? 0.3 : 0.9, 0.999,
                               round % 6 == 0 ? 1e10 : 1e-8, round % 7 == 0 ? 0.0 : 0.1, round % 2 ? 0.37 : 1.0};
    hyper.decoupled_weight_decay = round % 2 == 0;
    hyper.maximize = round % 3 == 0;
    const bool amsgrad = round % 4 < 2;
    for (std::int64_t step = 1; step <= 2; ++step) {
      AdamWBuffers a = buffers_of(one_pass, 1, count, grad_type, out_type, round % 5 != 1);
      AdamWBuffers b = buffers_of(chunked, 1, count, grad_type, out_type, round % 5 != 1);
      if (amsgrad) {
        a.max_exp_avg_sq = max_one.data() + 1;
        b.max_exp_avg_sq = max_chunked.data() + 1;
      }
      const int threads = 1 + round % 3;
      adamw_step(hyper, step, a, threads);
      AdamWHyperparameters handed = hyper;
      handed.vector_sqrt = correctly_rounded_roots;
      adamw_step(handed, step, b, threads);
    }
    const auto same_bits = [](const auto& x, const auto& y) {
      return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0;
    };
    EXPECT_TRUE(same_bits(one_pass.master, chunked.master)) << "round " << round << ", " << count << " elements";
    EXPECT_TRUE(same_bits(one_pass.m, chunked.m)) << "round " << round;
    EXPECT_TRUE(same_bits(one_pass.v, chunked.v)) << "round " << round;
    EXPECT_TRUE(same_bits(one_pass.out, chunked.out)) << "round " << round;
    EXPECT_TRUE(same_bits(max_one, max_chunked)) << "round " << round;
  }
}

TEST(AdamWKernel, MaximizeIsTheUpdateOfTheNegatedGradientBitForBit) {
  float up[3] = {1.0f, -2.0f, 0.5f}, m1[3] = {}, v1[3] = {};
  float down[3] = {1.0f, -2.0f, 0.5f}, m2[3] = {}, v2[3] = {};
  const float grad[3] = {0.5f, -3.0f, 0.25f};
  const float negated[3] = {-0.5f, 3.0f, -0.25f};
  for (const bool decoupled : {true, false}) {
    AdamWHyperparameters hyper{0.01, 0.9, 0.999, 1e-8, 0.1, 0.5};
    hyper.decoupled_weight_decay = decoupled;
    adamw_step(hyper, 1, {down, m2, v2, negated, ElementType::kFloat32, nullptr, ElementType::kFloat32, 3});
    hyper.maximize = true;
    adamw_step(hyper, 1, {up, m1, v1, grad, ElementType::kFloat32, nullptr, ElementType::kFloat32, 3});
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(up[i], down[i]) << i;
      EXPECT_EQ(m1[i], m2[i]) << i;
      EXPECT_EQ(v1[i], v2[i]) << i;
    }
  }
}

TEST(AdamWKernel, AmsgradDividesByTheLargestSecondMomentSeen) {
  // A large gradient, then a small one: v falls, its maximum stays, and the step is smaller
  // than without amsgrad.
  float with[1] = {1.0f}, m1[1] = {}, v1[1] = {}, v_max[1] = {};
  float without[1] = {1.0f}, m2[1] = {}, v2[1] = {};
  const AdamWHyperparameters hyper{0.1, 0.9, 0.5, 1e-8, 0.0};
  const float large[1] = {10.0f}, small[1] = {0.01f};
  AdamWBuffers a{with, m1, v1, large, ElementType::kFloat32, nullptr, ElementType::kFloat32, 1, v_max};
  const AdamWBuffers b{without, m2, v2, large, ElementType::kFloat32, nullptr, ElementType::kFloat32, 1};
  adamw_step(hyper, 1, a);
  adamw_step(hyper, 1, b);
  const float peak = v_max[0];
  EXPECT_EQ(peak, v1[0]);
  a.grad = small;
  AdamWBuffers b2 = b;
  b2.grad = small;
  const float before_with = with[0], before_without = without[0];
  adamw_step(hyper, 2, a);
  adamw_step(hyper, 2, b2);
  EXPECT_LT(v1[0], peak);
  EXPECT_EQ(v_max[0], peak);
  EXPECT_LT(std::abs(with[0] - before_with), std::abs(without[0] - before_without));
}

TEST(AdamWKernel, AdamsPenaltyEntersTheMomentsAndAdamWsDecayDoesNot) {
  float adam[1] = {2.0f}, m1[1] = {}, v1[1] = {};
  float adamw[1] = {2.0f}, m2[1] = {}, v2[1] = {};
  const float grad[1] = {0.0f};
  AdamWHyperparameters hyper{0.01, 0.9, 0.999, 1e-8, 0.5};
  adamw_step(hyper, 1, {adamw, m2, v2, grad, ElementType::kFloat32, nullptr, ElementType::kFloat32, 1});
  hyper.decoupled_weight_decay = false;
  adamw_step(hyper, 1, {adam, m1, v1, grad, ElementType::kFloat32, nullptr, ElementType::kFloat32, 1});
  EXPECT_EQ(m2[0], 0.0f);
  EXPECT_FLOAT_EQ(adamw[0], 2.0f * (1 - 0.01f * 0.5f));
  EXPECT_FLOAT_EQ(m1[0], 0.1f * 0.5f * 2.0f);  // (1 - beta1) * weight_decay * weight
  EXPECT_NEAR(adam[0], 2.0f - 0.01f, 1e-6f);   // the first step moves by lr against the penalty
}

// States in the parameter's own precision: within one step of that precision of the reference
// (each rounds as it stores; the fast path computes in float, the reference in double).
TEST(AdamWKernel, ParametersKeptInTheirOwnPrecisionFollowTheReference) {
  std::mt19937 random(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const ElementType type : {ElementType::kBFloat16, ElementType::kFloat16}) {
    for (const bool decoupled : {true, false}) {
      for (const bool amsgrad : {false, true}) {
        const std::size_t count = 70001;
        std::vector<std::uint16_t> param(count), m(count, 0), v(count, 0), vmax(count, 0), grad(count);
        const auto narrow = [&](float x) {
          if (type == ElementType::kBFloat16) return float_to_bfloat16(x);
          const auto half = static_cast<_Float16>(x);
          std::uint16_t bits;
          std::memcpy(&bits, &half, 2);
          return bits;
        };
        const auto wide = [&](std::uint16_t bits) {
          if (type == ElementType::kBFloat16) return bfloat16_to_float(bits);
          _Float16 half;
          std::memcpy(&half, &bits, 2);
          return static_cast<float>(half);
        };
        for (std::size_t i = 0; i < count; ++i) {
          param[i] = narrow(normal(random));
          grad[i] = narrow(0.1f * normal(random));
        }
        auto p2 = param, m2 = m, v2 = v, vmax2 = vmax;
        AdamWHyperparameters hyper{1e-3, 0.9, 0.999, 1e-6, 0.1};
        hyper.decoupled_weight_decay = decoupled;
        for (std::int64_t step = 1; step <= 3; ++step) {
          adam_step_narrow(hyper, step, {param.data(), m.data(), v.data(), grad.data(),
                                         amsgrad ? vmax.data() : nullptr, type, count}, 2);
          adam_step_narrow_reference(hyper, step, {p2.data(), m2.data(), v2.data(), grad.data(),
                                                   amsgrad ? vmax2.data() : nullptr, type, count});
        }
        const float ulp = type == ElementType::kBFloat16 ? 0x1p-7f : 0x1p-10f;
        // fp16's subnormals are 2^-24 apart: small second moments live there.
        const float floor = type == ElementType::kBFloat16 ? 1e-9f : 0x1p-23f;
        for (std::size_t i = 0; i < count; ++i) {
          ASSERT_NEAR(wide(param[i]), wide(p2[i]), 2 * ulp * std::abs(wide(p2[i])) + 1e-6f) << i;
          ASSERT_NEAR(wide(m[i]), wide(m2[i]), 2 * ulp * std::abs(wide(m2[i])) + floor) << i;
          ASSERT_NEAR(wide(v[i]), wide(v2[i]), 2 * ulp * std::abs(wide(v2[i])) + floor) << i;
        }
      }
    }
  }
}

TEST(AdamWKernel, ThreadsGiveTheSameBitsAsOne) {
  std::mt19937 random(11);
  const AdamWHyperparameters hyper{3e-4, 0.9, 0.95, 1e-8, 0.1};
  const std::size_t count = 300007;
  State one = random_state(count, ElementType::kBFloat16, ElementType::kBFloat16, random);
  State many = one;
  adamw_step(hyper, 5, buffers_of(one, 0, count, ElementType::kBFloat16, ElementType::kBFloat16, true), 1);
  adamw_step(hyper, 5, buffers_of(many, 0, count, ElementType::kBFloat16, ElementType::kBFloat16, true), 4);
  EXPECT_EQ(one.master, many.master);
  EXPECT_EQ(one.m, many.m);
  EXPECT_EQ(one.v, many.v);
  EXPECT_EQ(one.out, many.out);
}

TEST(AdamWKernel, TheFirstStepMovesEachWeightByTheLearningRateAgainstItsGradient) {
  float master[2] = {1.0f, -2.0f}, m[2] = {0, 0}, v[2] = {0, 0};
  const float grad[2] = {0.5f, -3.0f};
  const AdamWHyperparameters hyper{0.01, 0.9, 0.999, 1e-12, 0.1};
  adamw_step(hyper, 1, {master, m, v, grad, ElementType::kFloat32, nullptr, ElementType::kFloat32, 2});
  EXPECT_NEAR(master[0], 1.0f * (1 - 0.001f) - 0.01f, 1e-6f);
  EXPECT_NEAR(master[1], -2.0f * (1 - 0.001f) + 0.01f, 1e-6f);
  EXPECT_NEAR(m[1], -0.3f, 1e-6f);
  EXPECT_NEAR(v[1], 0.009f, 1e-7f);
}

TEST(AdamWKernel, TheGradientScaleActsAsIfTheGradientsWereScaledFirst) {
  // Unscaling a loss-scaled fp16 gradient by 1/1024 inside the kernel gives the update of the
  // unscaled gradient: the scale is exact in binary, so the bits agree.
  float scaled_master[3] = {1.0f, -2.0f, 0.5f}, m1[3] = {}, v1[3] = {};
  float plain_master[3] = {1.0f, -2.0f, 0.5f}, m2[3] = {}, v2[3] = {};
  const float scaled[3] = {512.0f, -3072.0f, 0.25f};
  const float plain[3] = {0.5f, -3.0f, 0.25f / 1024};
  AdamWHyperparameters hyper{0.01, 0.9, 0.999, 1e-8, 0.1};
  adamw_step(hyper, 1, {plain_master, m2, v2, plain, ElementType::kFloat32, nullptr, ElementType::kFloat32, 3});
  hyper.grad_scale = 1.0 / 1024;
  adamw_step(hyper, 1, {scaled_master, m1, v1, scaled, ElementType::kFloat32, nullptr, ElementType::kFloat32, 3});
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(scaled_master[i], plain_master[i]) << i;
    EXPECT_EQ(m1[i], m2[i]) << i;
    EXPECT_EQ(v1[i], v2[i]) << i;
  }
  hyper.grad_scale = INFINITY;
  EXPECT_THROW(adamw_step(hyper, 2, {scaled_master, m1, v1, scaled, ElementType::kFloat32, nullptr,
                                     ElementType::kFloat32, 3}),
               LogicError);
}

TEST(AdamWKernel, BFloat16RoundsToNearestEvenAndKeepsNaNAndInfinity) {
  EXPECT_EQ(float_to_bfloat16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bfloat16(std::bit_cast<float>(0x3F808000u)), 0x3F80);  // tie, even below
  EXPECT_EQ(float_to_bfloat16(std::bit_cast<float>(0x3F818000u)), 0x3F82);  // tie, even above
  EXPECT_EQ(float_to_bfloat16(std::bit_cast<float>(0x3F808001u)), 0x3F81);
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(std::bit_cast<float>(0x7FFFFFFFu)))));
  EXPECT_EQ(bfloat16_to_float(float_to_bfloat16(INFINITY)), INFINITY);
}

// The kernel's own fp16 conversions (vectorisable) against the compiler's _Float16 casts: every
// half read, and floats across the whole range written, with every rounding tie and its
// neighbours; a NaN stays a quiet NaN with its payload's top bits.
TEST(AdamWKernel, Float16ConvertsAsTheHardwareDoes) {
  const auto half_bits = [](_Float16 h) { return std::bit_cast<std::uint16_t>(h); };
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float ours = float16_to_float(bits);
    const float theirs = static_cast<float>(std::bit_cast<_Float16>(bits));
    if (std::isnan(theirs)) {
      ASSERT_TRUE(std::isnan(ours)) << h;
      EXPECT_EQ(std::bit_cast<std::uint32_t>(ours), 0x7FC00000u | ((h & 0x8000u) << 16) | ((h & 0x3FFu) << 13)) << h;
      continue;
    }
    ASSERT_EQ(std::bit_cast<std::uint32_t>(ours), std::bit_cast<std::uint32_t>(theirs)) << h;
    // the tie between this half and the next, and a float either side of it
    const float next = static_cast<float>(std::bit_cast<_Float16>(static_cast<std::uint16_t>(h + 1)));
    if ((h & 0x7FFFu) >= 0x7C00u || std::isnan(next) || std::isinf(next)) continue;
    const auto tie = std::bit_cast<std::uint32_t>(static_cast<float>((static_cast<double>(ours) + next) / 2));
    for (const std::uint32_t f : {tie - 1, tie, tie + 1}) {
      const float value = std::bit_cast<float>(f);
      ASSERT_EQ(float_to_float16(value), half_bits(static_cast<_Float16>(value))) << std::hex << f;
    }
  }
  for (std::uint64_t f = 0; f < (1ull << 32); f += 4099) {
    const auto bits = static_cast<std::uint32_t>(f);
    const float value = std::bit_cast<float>(bits);
    const std::uint16_t ours = float_to_float16(value);
    if (std::isnan(value)) {
      EXPECT_EQ(ours, ((bits >> 16) & 0x8000u) | 0x7E00u | ((bits >> 13) & 0x3FFu)) << std::hex << f;
      continue;
    }
    ASSERT_EQ(ours, half_bits(static_cast<_Float16>(value))) << std::hex << f;
  }
}

TEST(AdamWKernel, BadArgumentsAreRefusedWithTheirReason) {
  float x = 0;
  const AdamWBuffers buffers{&x, &x, &x, &x, ElementType::kFloat32, nullptr, ElementType::kFloat32, 1};
  EXPECT_THROW(adamw_step({}, 0, buffers), LogicError);
  EXPECT_THROW(adamw_step({1e-3, 1.0, 0.999, 1e-8, 0}, 1, buffers), LogicError);
  AdamWBuffers missing = buffers;
  missing.exp_avg = nullptr;
  EXPECT_THROW(adamw_step({}, 1, missing), LogicError);
  missing.count = 0;
  EXPECT_NO_THROW(adamw_step({}, 1, missing));
}

}  // namespace
}  // namespace stowage::offload
