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

// The f32 summary min m / max M (d values, stride 1) onto the page's 8-bit grid: a, b (d codes
// each) and grid[0] = lo, grid[1] = step (kv/page_codes.hpp's definition). Non-finite summaries
// (a page without tokens) give all zeros.
MASSKV_HD inline void round_range8(const float* m, const float* M, int d, std::uint8_t* a,
                                   std::uint8_t* b, float* grid) {
  bool ok = true;
  float lo = INFINITY, hi = -INFINITY;
  for (int c = 0; c < d; ++c) {
    ok = ok && finite(m[c]) && finite(M[c]);
    lo = m[c] < lo ? m[c] : lo;
    hi = hi < M[c] ? M[c] : hi;
  }
  if (!ok || !(lo <= hi)) {
    grid[0] = grid[1] = 0.f;
    for (int c = 0; c < d; ++c) a[c] = b[c] = 0;
    return;
  }
  float step = 0.f;
  if (hi > lo) {
    step = static_cast<float>(hd::div(hd::add(static_cast<double>(hi), -static_cast<double>(lo)),
                                      255.0));
    while (dequant8(255, lo, step) < hi) step = nextafterf(step, INFINITY);
  }
  grid[0] = lo;
  grid[1] = step;
  for (int c = 0; c < d; ++c) {
    int cm = 0, cM = 255;
    if (step > 0) {
      const double fm = floor(hd::div(hd::add(static_cast<double>(m[c]), -static_cast<double>(lo)),
                                      static_cast<double>(step)));
      const double fM = ceil(hd::div(hd::add(static_cast<double>(M[c]), -static_cast<double>(lo)),
                                     static_cast<double>(step)));
      cm = fm < 0 ? 0 : fm > 255 ? 255 : static_cast<int>(fm);
      cM = fM < 0 ? 0 : fM > 255 ? 255 : static_cast<int>(fM);
    } else {
      cM = 0;
    }
    // The quotients above are a first guess; the loops make the codes exact for the f32 grid.
    while (cm > 0 && dequant8(static_cast<std::uint8_t>(cm), lo, step) > m[c]) --cm;
    while (cm < 255 && dequant8(static_cast<std::uint8_t>(cm + 1), lo, step) <= m[c]) ++cm;
    while (cM < 255 && dequant8(static_cast<std::uint8_t>(cM), lo, step) < M[c]) ++cM;
    while (cM > 0 && dequant8(static_cast<std::uint8_t>(cM - 1), lo, step) >= M[c]) --cM;
    a[c] = static_cast<std::uint8_t>(cm);
    b[c] = static_cast<std::uint8_t>(cM);
  }
}

// One step of Welford's update with x, the n-th value, in f64.
MASSKV_HD inline void welford_step(double x, double n, double& mean, double& m2) {
  const double delta = hd::add(x, -mean);
  mean = hd::add(mean, hd::div(delta, n));
  m2 = hd::add(m2, hd::mul(delta, hd::add(x, -mean)));
}

}  // namespace masskv::kv::codes_math
