// Host emulation of quest_score_kernel's arithmetic (the same operation order, std::fma) against
// select::page_upper_bounds on the bf16 store: bit-identical on the AVX2 path, and within the
// check's eps on the portable one (MASSKV_ISA=scalar). Build against a configured build dir:
//   g++ -std=c++20 -O2 -ffp-contract=off -Iinclude tools/gpu_bench/host_emu/score_emu.cpp \
//       build-gpu/libmasskv.a -fopenmp -o /tmp/score_emu && /tmp/score_emu
// Host emulation of quest_score_kernel's arithmetic (same op order, std::fma) vs the CPU bound.
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "masskv/select/page_bound.hpp"
using namespace masskv;
static float bf(std::uint16_t b) { return std::bit_cast<float>(std::uint32_t{b} << 16); }
int main() {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> U(-2, 2);
  long tot = 0, same = 0;
  double worst = 0;
  for (int d : {64, 128, 256})
    for (int g : {1, 3, 4, 7}) {
      const int pages = 200, H = 2;
      std::vector<float> mn(pages * H * d), mx(mn.size());
      for (size_t i = 0; i < mn.size(); ++i) {
        float a = U(rng), b = U(rng);
        mn[i] = std::min(a, b);
        mx[i] = std::max(a, b);
      }
      kv::SummariesView sv;
      sv.min = mn.data();
      sv.max = mx.data();
      sv.num_pages = pages;
      sv.num_kv_heads = H;
      sv.head_dim = d;
      select::BoundStore st(sv);
      auto hv = st.view();
      std::vector<float> q(g * d);
      for (auto& x : q) x = U(rng) * 1.5f;
      std::vector<std::int32_t> ids(pages);
      for (int i = 0; i < pages; ++i) ids[i] = i;
      const float scale = 1.0f / std::sqrt(static_cast<float>(d));
      for (int h = 0; h < H; ++h) {
        std::vector<float> out(g * pages);
        select::page_upper_bounds(hv, ids, h, q.data(), g, d, scale, out);
        const float f = 2.0f * static_cast<float>(2 * d + 4) * 0x1p-24f;
        for (int j = 0; j < pages; ++j) {
          const std::uint16_t* lo =
              reinterpret_cast<const std::uint16_t*>(hv.min) + (j * H + h) * d;
          const std::uint16_t* hi =
              reinterpret_cast<const std::uint16_t*>(hv.max) + (j * H + h) * d;
          float w = 0;
          for (int c = 0; c < d; ++c)
            w = std::fmax(w, std::fmax(std::fabs(bf(hi[c])), std::fabs(bf(lo[c]))));
          for (int i = 0; i < g; ++i) {
            float l1 = 0;
            for (int c = 0; c < d; ++c) l1 += std::fabs(q[i * d + c]);
            const float fq = f * l1;
            float ap[8] = {}, an[8] = {};
            for (int k = 0; k < d / 8; ++k)
              for (int l = 0; l < 8; ++l) {
                const float x = q[i * d + 8 * k + l];
                const float qp = x > 0 ? x : 0.f, qn = x < 0 ? x : 0.f;
                ap[l] = std::fma(qp, bf(hi[8 * k + l]), ap[l]);
                an[l] = std::fma(qn, bf(lo[8 * k + l]), an[l]);
              }
            float v[8];
            for (int l = 0; l < 8; ++l) v[l] = ap[l] + an[l];
            const float s = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
            const float t1 = fq * w;
            const float t2 = s + t1;
            const float t3 = t2 + FLT_MIN;
            const float bound = scale * t3;
            {
              double l1d = 0;
              for (int c = 0; c < d; ++c) l1d += std::fabs(q[i * d + c]);
              const double eps =
                  scale * (2.0 * (2 * d + 4) * 0x1p-24 * l1d * w + 8 * 0x1p-24 * std::fabs(bound));
              worst = std::max(worst, std::fabs((double)bound - out[i * pages + j]) / eps);
            }
            ++tot;
            same += std::bit_cast<std::uint32_t>(bound) ==
                    std::bit_cast<std::uint32_t>(out[i * pages + j]);
          }
        }
      }
    }
  std::printf("bit-identical %ld / %ld, worst %.4f eps\n", same, tot, worst);
}
