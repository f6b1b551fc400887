// The arithmetic of page codes (masskv/kv/page_codes.hpp) that the CPU cache and the CUDA
// encoder share, host and device (MASSKV_HD): the 8-bit range grid, a key's 2-bit level, and
// the Welford step of the sequence moments behind the spread rows. One copy, so both give the
// same bits: f32 operations each rounded once (a fused multiply-add only where the definition
// says fma), f64 ones through core/host_device.hpp's helpers.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.hpp"

namespace masskv::kv::codes_math {

// fma(code, step, lo) in f32, one rounding.
MASSKV_HD inline float dequant8(std::uint8_t code, float lo, float step) {
  return fmaf(static_cast<float>(code), step, lo);
}

// Finite (not inf or NaN), with no library call: x - x is 0 exactly for finite x only.
MASSKV_HD inline bool finite(float x) { return x - x == 0.0f; }

// The 2-bit level of x in [lo, hi]: RNE(3 (x - lo) / (hi - lo)) clamped to [0, 3]; 0 when the
// range is empty. Each f32 operation rounded once (nothing for nvcc to contract).
MASSKV_HD inline std::uint8_t level(float x, float lo, float hi) {
  if (!(hi > lo)) return 0;
  const float t = rintf(3.0f * ((x - lo) / (hi - lo)));
  return static_cast<std::uint8_t>(t <= 0 ? 0 : t >= 3 ? 3 : t);
}

// The page's 8-bit grid from its f32 summary min m / max M (d values, stride 1): grid[0] = lo =
// min_c m_c, grid[1] = step, the smallest f32 at or above (hi - lo) / 255 whose code 255 reaches
// hi (kv/page_codes.hpp's definition). False for non-finite summaries (a page without tokens):
// then grid is zeros and every code 0.
MASSKV_HD inline bool range8_grid(const float* m, const float* M, int d, float* grid) {
  bool ok = true;
  float lo = INFINITY, hi = -INFINITY;
  for (int c = 0; c < d; ++c) {
    ok = ok && finite(m[c]) && finite(M[c]);
    lo = m[c] < lo ? m[c] : lo;
    hi = hi < M[c] ? M[c] : hi;
  }
  if (!ok || !(lo <= hi)) {
    grid[0] = grid[1] = 0.f;
    return false;
  }
  float step = 0.f;
  if (hi > lo) {
    step = static_cast<float>(hd::div(hd::add(static_cast<double>(hi), -static_cast<double>(lo)),
                                      255.0));
    while (dequant8(255, lo, step) < hi) step = nextafterf(step, INFINITY);
  }
  grid[0] = lo;
  grid[1] = step;
  return true;
}

// One channel's codes on the grid (lo, step): a = the largest code at or below m, b = the
// smallest at or above M. Channels are independent, so a GPU encoder runs them in parallel.
MASSKV_HD inline void range8_channel(float m, float M, float lo, float step, std::uint8_t& a,
                                     std::uint8_t& b) {
  int cm = 0, cM = 255;
  if (step > 0) {
    const double fm = floor(hd::div(hd::add(static_cast<double>(m), -static_cast<double>(lo)),
                                    static_cast<double>(step)));
    const double fM = ceil(hd::div(hd::add(static_cast<double>(M), -static_cast<double>(lo)),
                                   static_cast<double>(step)));
    cm = fm < 0 ? 0 : fm > 255 ? 255 : static_cast<int>(fm);
    cM = fM < 0 ? 0 : fM > 255 ? 255 : static_cast<int>(fM);
  } else {
    cM = 0;
  }
  // The quotients above are a first guess; the loops make the codes exact for the f32 grid.
  while (cm > 0 && dequant8(static_cast<std::uint8_t>(cm), lo, step) > m) --cm;
  while (cm < 255 && dequant8(static_cast<std::uint8_t>(cm + 1), lo, step) <= m) ++cm;
  while (cM < 255 && dequant8(static_cast<std::uint8_t>(cM), lo, step) < M) ++cM;
  while (cM > 0 && dequant8(static_cast<std::uint8_t>(cM - 1), lo, step) >= M) --cM;
  a = static_cast<std::uint8_t>(cm);
  b = static_cast<std::uint8_t>(cM);
}

// The f32 summary min m / max M (d values, stride 1) onto the page's 8-bit grid: a, b (d codes
// each) and grid = (lo, step) (range8_grid, then range8_channel for each channel).
MASSKV_HD inline void round_range8(const float* m, const float* M, int d, std::uint8_t* a,
                                   std::uint8_t* b, float* grid) {
  const bool ok = range8_grid(m, M, d, grid);
  for (int c = 0; c < d; ++c) {
    if (ok) {
      range8_channel(m[c], M[c], grid[0], grid[1], a[c], b[c]);
    } else {
      a[c] = b[c] = 0;
    }
  }
}

// One step of Welford's update with x, the n-th value, in f64.
MASSKV_HD inline void welford_step(double x, double n, double& mean, double& m2) {
  const double delta = hd::add(x, -mean);
  mean = hd::add(mean, hd::div(delta, n));
  m2 = hd::add(m2, hd::mul(delta, hd::add(x, -mean)));
}

}  // namespace masskv::kv::codes_math
