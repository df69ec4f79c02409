// The host kernel written out of place (AdamWSources, NarrowAdamSources): for every precision,
// option and path, bit for bit the in-place update, its sources left as they were; the reference
// likewise; sources set in part refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "base/errors.hpp"
#include "offload/adamw_kernel.hpp"

namespace stowage::offload {
namespace {

constexpr ElementType kTypes[] = {ElementType::kFloat32, ElementType::kBFloat16, ElementType::kFloat16};

// One bucket's fp32 states and its gradient and output bytes; values at float's edges mixed in.
struct States {
  std::vector<float> master, m, v, v_max;
  std::vector<unsigned char> grad, out;
};

States random_states(std::size_t count, ElementType grad_type, ElementType out_type, std::mt19937& random) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float edges[] = {0.0f, -0.0f, 1e-40f, 3e38f, INFINITY, NAN};
  States s;
  for (std::size_t i = 0; i < count; ++i) {
    const bool edge = i % 97 == 5;
    s.master.push_back(edge ? edges[i % std::size(edges)] : normal(random));
    s.m.push_back(0.1f * normal(random));
    s.v.push_back(0.01f * std::abs(normal(random)));
    s.v_max.push_back(0.012f * std::abs(normal(random)));
  }
  s.grad.resize(count * element_size(grad_type));
  for (std::size_t i = 0; i < count; ++i) {
    const float g = normal(random);
    if (grad_type == ElementType::kFloat32) std::memcpy(&s.grad[i * 4], &g, 4);
    const std::uint16_t bits = grad_type == ElementType::kBFloat16 ? float_to_bfloat16(g) : float_to_float16(g);
    if (grad_type != ElementType::kFloat32) std::memcpy(&s.grad[i * 2], &bits, 2);
  }
  s.out.assign(count * element_size(out_type), 0);
  return s;
}

AdamWBuffers in_place(States& s, ElementType grad_type, ElementType out_type, bool with_out, bool amsgrad) {
  AdamWBuffers b{s.master.data(), s.m.data(), s.v.data(), s.grad.data(), grad_type,
                 with_out ? s.out.data() : nullptr, out_type, s.master.size()};
  if (amsgrad) b.max_exp_avg_sq = s.v_max.data();
  return b;
}

// Results into `to`, the states read from `from` (which the update must leave alone).
AdamWBuffers out_of_place(const States& from, States& to, ElementType grad_type, ElementType out_type, bool with_out,
                          bool amsgrad) {
  AdamWBuffers b = in_place(to, grad_type, out_type, with_out, amsgrad);
  b.grad = from.grad.data();
  b.sources = {from.master.data(), from.m.data(), from.v.data(), amsgrad ? from.v_max.data() : nullptr};
  return b;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void correctly_rounded_roots(int count, const float* in, float* out) {
  for (int i = 0; i < count; ++i) out[i] = std::sqrt(in[i]);
}

TEST(AdamWKernelOutOfPlace, GivesTheInPlaceBitsAndLeavesItsSourcesAlone) {
  std::mt19937 random(31);
  int cases = 0;
  for (const ElementType grad_type : kTypes) {
    for (const ElementType out_type : kTypes) {
      for (const bool with_out : {false, true}) {
        for (const bool decoupled : {true, false}) {
          for (const bool amsgrad : {false, true}) {
            for (const bool chunked : {false, true}) {
              AdamWHyperparameters hyper{1e-3, 0.9, 0.999, 1e-8, 0.05, 0.75};
              hyper.decoupled_weight_decay = decoupled;
              hyper.maximize = cases % 3 == 1;
              if (chunked) hyper.vector_sqrt = &correctly_rounded_roots;
              const std::size_t count = 1 + random() % 150000;  // several threads' shares, odd tails
              const States before = random_states(count, grad_type, out_type, random);
              States expected = before;
              States sources = before;
              States results = random_states(count, grad_type, out_type, random);  // stale bytes, overwritten
              const std::int64_t step = 1 + cases % 5;
              const int threads = 1 + cases % 3;
              adamw_step(hyper, step, in_place(expected, grad_type, out_type, with_out, amsgrad), threads);
              adamw_step(hyper, step, out_of_place(sources, results, grad_type, out_type, with_out, amsgrad), threads);
              EXPECT_TRUE(same_bits(results.master, expected.master)) << cases;
              EXPECT_TRUE(same_bits(results.m, expected.m)) << cases;
              EXPECT_TRUE(same_bits(results.v, expected.v)) << cases;
              if (amsgrad) { EXPECT_TRUE(same_bits(results.v_max, expected.v_max)) << cases; }
              if (with_out) { EXPECT_EQ(results.out, expected.out) << cases; }
              EXPECT_TRUE(same_bits(sources.master, before.master) && same_bits(sources.m, before.m) &&
                          same_bits(sources.v, before.v) && same_bits(sources.v_max, before.v_max))
                  << cases;
              ++cases;
            }
          }
        }
      }
    }
  }
}

TEST(AdamWKernelOutOfPlace, TheReferenceReadsTheSourcesToo) {
  std::mt19937 random(37);
  for (const bool amsgrad : {false, true}) {
    const AdamWHyperparameters hyper{1e-3, 0.9, 0.99, 1e-8, 0.1, 0.5};
    const States before = random_states(1001, ElementType::kBFloat16, ElementType::kBFloat16, random);
    States expected = before;
    States sources = before;
    States results = random_states(1001, ElementType::kBFloat16, ElementType::kBFloat16, random);
    adamw_step_reference(hyper, 3, in_place(expected, ElementType::kBFloat16, ElementType::kBFloat16, true, amsgrad));
    adamw_step_reference(
        hyper, 3, out_of_place(sources, results, ElementType::kBFloat16, ElementType::kBFloat16, true, amsgrad));
    EXPECT_TRUE(same_bits(results.master, expected.master));
    EXPECT_TRUE(same_bits(results.m, expected.m));
    EXPECT_TRUE(same_bits(results.v, expected.v));
    if (amsgrad) { EXPECT_TRUE(same_bits(results.v_max, expected.v_max)); }
    EXPECT_EQ(results.out, expected.out);
    EXPECT_TRUE(same_bits(sources.master, before.master) && same_bits(sources.m, before.m));
  }
}

TEST(AdamWKernelOutOfPlace, AParameterKeptInItsOwnPrecisionGivesTheInPlaceBits) {
  std::mt19937 random(41);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const ElementType type : {ElementType::kBFloat16, ElementType::kFloat16}) {
    for (const bool decoupled : {true, false}) {
      for (const bool amsgrad : {false, true}) {
        const auto narrow = [&](float x) {
          return type == ElementType::kBFloat16 ? float_to_bfloat16(x) : float_to_float16(x);
        };
        const std::size_t count = 70001;
        std::vector<std::uint16_t> param(count), m(count), v(count), v_max(count), grad(count);
        for (std::size_t i = 0; i < count; ++i) {
          param[i] = narrow(normal(random));
          m[i] = narrow(0.1f * normal(random));
          v[i] = narrow(0.01f * std::abs(normal(random)));
          v_max[i] = narrow(0.012f * std::abs(normal(random)));
          grad[i] = narrow(0.1f * normal(random));
        }
        const auto before = std::vector<std::vector<std::uint16_t>>{param, m, v, v_max};
        std::vector<std::uint16_t> p1 = param, m1 = m, v1 = v, max1 = v_max;        // in place
        std::vector<std::uint16_t> p2(count, 1), m2(count, 2), v2(count, 3), max2(count, 4);  // results
        AdamWHyperparameters hyper{1e-3, 0.9, 0.999, 1e-6, 0.1};
        hyper.decoupled_weight_decay = decoupled;
        adam_step_narrow(hyper, 4, {p1.data(), m1.data(), v1.data(), grad.data(), amsgrad ? max1.data() : nullptr, type,
                                    count}, 2);
        NarrowAdamBuffers apart{p2.data(), m2.data(), v2.data(), grad.data(), amsgrad ? max2.data() : nullptr, type,
                                count};
        apart.sources = {param.data(), m.data(), v.data(), amsgrad ? v_max.data() : nullptr};
        adam_step_narrow(hyper, 4, apart, 2);
        EXPECT_EQ(p2, p1);
        EXPECT_EQ(m2, m1);
        EXPECT_EQ(v2, v1);
        if (amsgrad) { EXPECT_EQ(max2, max1); }
        EXPECT_EQ((std::vector<std::vector<std::uint16_t>>{param, m, v, v_max}), before);
        // The reference, out of place, from the same sources.
        std::vector<std::uint16_t> p3(count), m3(count), v3(count), max3(count);
        std::vector<std::uint16_t> p4 = param, m4 = m, v4 = v, max4 = v_max;
        NarrowAdamBuffers reference{p3.data(), m3.data(), v3.data(), grad.data(), amsgrad ? max3.data() : nullptr,
                                    type, count};
        reference.sources = apart.sources;
        adam_step_narrow_reference(hyper, 4, reference);
        adam_step_narrow_reference(hyper, 4, {p4.data(), m4.data(), v4.data(), grad.data(),
                                              amsgrad ? max4.data() : nullptr, type, count});
        EXPECT_EQ(p3, p4);
        EXPECT_EQ(m3, m4);
      }
    }
  }
}

TEST(AdamWKernelOutOfPlace, SourcesSetInPartAreRefused) {
  std::vector<float> a(4), b(4);
  std::vector<float> grad(4, 0.5f);
  AdamWBuffers buffers{a.data(), a.data(), a.data(), grad.data(), ElementType::kFloat32, nullptr,
                       ElementType::kFloat32, 4};
  buffers.sources.master = b.data();  // the moments still read in place
  EXPECT_THROW(adamw_step({}, 1, buffers), LogicError);
  buffers.sources = {b.data(), b.data(), b.data(), b.data()};  // a maximum without amsgrad
  EXPECT_THROW(adamw_step({}, 1, buffers), LogicError);
  std::vector<std::uint16_t> n(4), g(4);
  NarrowAdamBuffers narrow{n.data(), n.data(), n.data(), g.data(), nullptr, ElementType::kBFloat16, 4};
  narrow.sources.exp_avg = n.data();
  EXPECT_THROW(adam_step_narrow({}, 1, narrow), LogicError);
}

}  // namespace
}  // namespace stowage::offload
