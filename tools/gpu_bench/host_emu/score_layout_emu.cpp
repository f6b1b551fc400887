// Host emulation of quest_score_kernel's layout in src/cuda/select.cu (the per-warp cp.async copy
// pattern into the stages, lane L = row L, q-head batches of 4, the pair shuffles), bit-compared
// with a direct evaluation in the operation order of the first kernel (score_emu.cpp checks that
// order against the CPU). Not a substitute for running the kernel. Build and run:
//   g++ -std=c++20 -O2 -ffp-contract=off tools/gpu_bench/host_emu/score_layout_emu.cpp -o /tmp/e && /tmp/e
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
static float bf(std::uint16_t b) { return std::bit_cast<float>(std::uint32_t{b} << 16); }
static std::uint32_t okey(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x + 0.0f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
constexpr int kWarpPages = 16, kHB = 4;
int fails = 0;
template <int kD>
void run(int g, int H, int h, int n, int chunk_pages, int warps, std::mt19937& rng, int bad_every) {
  const int kStages = kD == 64 ? 3 : 2;  // as kScoreStages<kD>
  const int kRowBytes = 2 * kD + 16, kStageBytes = 2 * kWarpPages * kRowBytes;
  const int kPieces = kD / 8, kRowsPerCopy = 32 / kPieces, kCopies = 2 * kWarpPages / kRowsPerCopy;
  const int pool = n + 7;
  std::vector<std::uint16_t> mn(pool * H * kD), mx(mn.size());
  std::uniform_real_distribution<float> U(-3, 3);
  for (size_t i = 0; i < mn.size(); ++i) {
    float a = U(rng), b = U(rng);
    mn[i] = std::bit_cast<std::uint32_t>(std::fmin(a, b)) >> 16;
    mx[i] = std::bit_cast<std::uint32_t>(std::fmax(a, b)) >> 16;
  }
  std::vector<int> indices(n);
  for (int j = 0; j < n; ++j) indices[j] = (j * 37 + 5) % pool;
  if (bad_every) for (int j = 3; j < n; j += bad_every) indices[j] = pool + j;  // bad ids
  std::vector<float> q(g * kD);
  for (auto& x : q) x = U(rng);
  const float scale = 1.0f / std::sqrt(float(kD)), slack = 2.0f * float(2 * kD + 4) * 0x1p-24f;
  std::vector<float> qpos(g * kD), qneg(g * kD), fq(g);
  for (int i = 0; i < g * kD; ++i) {
    qpos[i] = q[i] > 0 ? q[i] : 0.f;
    qneg[i] = q[i] < 0 ? q[i] : 0.f;
  }
  for (int i = 0; i < g; ++i) {
    float l1 = 0;
    for (int c = 0; c < kD; ++c) l1 += qpos[i * kD + c] - qneg[i * kD + c];
    fq[i] = slack * l1;
  }
  // Reference keys (the first kernel's order).
  std::vector<std::uint32_t> ref(n), got(n, 0xdeadbeefu);
  for (int j = 0; j < n; ++j) {
    const int ph = indices[j];
    if (ph < 0 || ph >= pool) { ref[j] = 0; continue; }
    const std::uint16_t* lo = &mn[(ph * H + h) * kD];
    const std::uint16_t* hi = &mx[(ph * H + h) * kD];
    float w = 0;
    for (int c = 0; c < kD; ++c) w = std::fmax(w, std::fmax(std::fabs(bf(hi[c])), std::fabs(bf(lo[c]))));
    float best = -INFINITY;
    for (int i = 0; i < g; ++i) {
      float ap[8] = {}, an[8] = {};
      for (int k = 0; k < kD / 8; ++k)
        for (int l = 0; l < 8; ++l) {
          ap[l] = std::fma(qpos[i * kD + 8 * k + l], bf(hi[8 * k + l]), ap[l]);
          an[l] = std::fma(qneg[i * kD + 8 * k + l], bf(lo[8 * k + l]), an[l]);
        }
      float v[8];
      for (int l = 0; l < 8; ++l) v[l] = ap[l] + an[l];
      const float s = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
      const float bound = scale * ((s + fq[i] * w) + FLT_MIN);
      best = (i == 0 || bound > best) ? bound : best;
    }
    ref[j] = okey(best);
  }
  // Emulated kernel: chunks, warps, tiles, stages (copies as byte moves).
  const int chunks = (n + chunk_pages - 1) / chunk_pages;
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const int j0 = chunk * chunk_pages, j1 = std::min(n, j0 + chunk_pages);
    const int tiles = (j1 - j0 + kWarpPages - 1) / kWarpPages;
    for (int warp = 0; warp < warps; ++warp) {
      std::vector<unsigned char> wbuf(kStages * kStageBytes, 0xAB);
      const int my_tiles = warp < tiles ? (tiles - warp + warps - 1) / warps : 0;
      auto page0 = [&](int t) { return j0 + (warp + t * warps) * kWarpPages; };
      using Ids = std::vector<int>;
      auto load_id = [&](int t) {
        Ids id(32);
        for (int lane = 0; lane < 32; ++lane) {
          const int pg = page0(t) + lane % kWarpPages;
          id[lane] = t < my_tiles && pg < j1 ? indices[pg] : 0;
        }
        return id;
      };
      auto issue = [&](int t, int st, const Ids& id) {
        const int pg0 = page0(t), tn = std::min(kWarpPages, j1 - pg0);
        int phys[32];
        for (int lane = 0; lane < 32; ++lane) {
          const int mine = lane % kWarpPages;
          phys[lane] = -1;
          if (mine < tn && id[lane] >= 0 && id[lane] < pool) phys[lane] = id[lane];
        }
        for (int it = 0; it < kCopies; ++it)
          for (int lane = 0; lane < 32; ++lane) {
            const int r = it * kRowsPerCopy + lane / kPieces, piece = lane % kPieces;
            const int ph = phys[r >> 1];
            unsigned char* dst = &wbuf[st * kStageBytes + r * kRowBytes + piece * 16];
            if (ph >= 0) {
              const std::uint16_t* src = ((r & 1) ? mx.data() : mn.data()) + h * kD +
                                         (std::int64_t)ph * H * kD + piece * 8;
              std::memcpy(dst, src, 16);
            } else {
              std::memset(dst, 0, 16);
            }
          }
      };
      // Pipeline order as the kernel (the emulation copies synchronously, so only the stage
      // indices are exercised).
      for (int s = 0; s < kStages - 1; ++s) if (s < my_tiles) issue(s, s, load_id(s));
      Ids next_id = load_id(kStages - 1);
      for (int t = 0; t < my_tiles; ++t) {
        if (t + kStages - 1 < my_tiles) issue(t + kStages - 1, (t + kStages - 1) % kStages, next_id);
        next_id = load_id(t + kStages);
        float acc[32][kHB][8], wl[32], best[32];
        for (int lane = 0; lane < 32; ++lane) { wl[lane] = 0; best[lane] = -INFINITY; }
        for (int i0 = 0; i0 < g; i0 += kHB) {
          const int nb = std::min(kHB, g - i0);
          for (int lane = 0; lane < 32; ++lane) {
            const unsigned char* row = &wbuf[(t % kStages) * kStageBytes + lane * kRowBytes];
            const float* qa = (lane & 1) ? qpos.data() : qneg.data();
            for (int i = 0; i < nb; ++i) for (int l = 0; l < 8; ++l) acc[lane][i][l] = 0;
            for (int k = 0; k < kD / 8; ++k) {
              std::uint16_t raw[8];
              std::memcpy(raw, row + 16 * k, 16);
              float x[8];
              for (int l = 0; l < 8; ++l) x[l] = bf(raw[l]);
              if (i0 == 0) for (int l = 0; l < 8; ++l) wl[lane] = std::fmax(wl[lane], std::fabs(x[l]));
              for (int i = 0; i < nb; ++i)
                for (int l = 0; l < 8; ++l)
                  acc[lane][i][l] = std::fma(qa[(i0 + i) * kD + 8 * k + l], x[l], acc[lane][i][l]);
            }
          }
          if (i0 == 0) {
            float w2[32];
            for (int lane = 0; lane < 32; ++lane) w2[lane] = std::fmax(wl[lane], wl[lane ^ 1]);
            std::memcpy(wl, w2, sizeof wl);
          }
          for (int i = 0; i < nb; ++i)
            for (int lane = 0; lane < 32; ++lane) {
              float v[8];
              for (int l = 0; l < 8; ++l) v[l] = acc[lane][i][l] + acc[lane ^ 1][i][l];
              const float s = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
              const float bound = scale * ((s + fq[i0 + i] * wl[lane]) + FLT_MIN);
              best[lane] = (i0 + i == 0 || bound > best[lane]) ? bound : best[lane];
            }
        }
        for (int lane = 0; lane < 32; lane += 2) {
          const int pg = page0(t) + lane / 2;
          if (pg >= j1) continue;
          const int id = indices[pg];
          const bool ok = id >= 0 && id < pool;
          if (got[pg] != 0xdeadbeefu) { std::printf("page %d written twice\n", pg); ++fails; }
          got[pg] = ok ? okey(best[lane]) : 0u;
        }
      }
    }
  }
  int bad = 0;
  for (int j = 0; j < n; ++j) bad += got[j] != ref[j];
  if (bad) {
    std::printf("d=%d g=%d H=%d h=%d n=%d chunk=%d warps=%d: %d of %d keys differ\n", kD, g, H, h,
                n, chunk_pages, warps, bad, n);
    ++fails;
  }
}
int main() {
  std::mt19937 rng(7);
  int cases = 0;
  for (int g : {1, 2, 3, 4, 5, 6, 7, 8, 16})
    for (int n : {1, 15, 16, 17, 100, 1000, 3001})
      for (int cp : {64, 192, 4096}) {
        const int warps = 1 + (cases * 5) % 12, H = 1 + cases % 3, h = cases % H;
        run<64>(g, H, h, n, cp, warps, rng, cases % 4 == 1 ? 13 : 0);
        run<128>(g, H, h, n, cp, warps, rng, cases % 4 == 2 ? 7 : 0);
        run<256>(g, H, h, n, cp, std::min(warps, 6), rng, 0);
        ++cases;
      }
  std::printf("%d cases x 3 head dims, %d failures\n", cases, fails);
  return fails != 0;
}
