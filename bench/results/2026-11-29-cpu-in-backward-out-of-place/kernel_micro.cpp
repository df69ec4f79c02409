// The AdamW kernel over 32 Mi fp32 states with bf16 gradients and outputs: in place (exact's
// update), out of place from sources (in_backward's provisional update now), and in place after
// copying the three states aside on the calling thread (in_backward's provisional update before).
// Interleaved, five rounds, one and two threads. Build from the worktree root after tools/build:
//   g++ -O2 -std=c++20 -I. <this file> build/default/offload/libstowage_offload.a \
//       build/default/base/libstowage_base.a -lpthread -o /tmp/kernel_micro
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "offload/adamw_kernel.hpp"

using namespace stowage::offload;
using Clock = std::chrono::steady_clock;

static double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

int main() {
  const std::size_t n = std::size_t{1} << 25;
  std::vector<float> p(n, 0.5f), m(n, 0.1f), v(n, 0.01f), p2(n), m2(n), v2(n), saved(3 * n);
  std::vector<std::uint16_t> g(n, 0x3f00), out(n);
  const AdamWHyperparameters h{};
  for (int round = 0; round < 5; ++round) {
    for (const int threads : {1, 2}) {
      const AdamWBuffers in_place{p.data(), m.data(), v.data(), g.data(), ElementType::kBFloat16, out.data(),
                                  ElementType::kBFloat16, n};
      auto start = Clock::now();
      adamw_step(h, 2, in_place, threads);
      const double exact = ms_since(start);
      AdamWBuffers apart{p2.data(), m2.data(), v2.data(), g.data(), ElementType::kBFloat16, out.data(),
                         ElementType::kBFloat16, n};
      apart.sources = {p.data(), m.data(), v.data(), nullptr};
      start = Clock::now();
      adamw_step(h, 2, apart, threads);
      const double out_of_place = ms_since(start);
      start = Clock::now();
      std::memcpy(saved.data(), p.data(), n * 4);
      std::memcpy(saved.data() + n, m.data(), n * 4);
      std::memcpy(saved.data() + 2 * n, v.data(), n * 4);
      adamw_step(h, 2, in_place, threads);
      const double copied_aside = ms_since(start);
      std::printf("threads %d  in place %6.1f ms  out of place %6.1f ms  copied aside, then in place %6.1f ms\n",
                  threads, exact, out_of_place, copied_aside);
    }
  }
}
