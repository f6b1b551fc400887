// The distributed entmax threshold (docs/design.md §2.1, §2.6; docs/dist.md "Entmax").
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attn/entmax_weight.hpp"
#include "masskv/dist/decode.hpp"
#include "masskv/error.hpp"

namespace masskv::dist {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Per rank and head, in the all-gather: count, tau_lo, max z, then the candidates.
constexpr std::size_t kHeader = 3;

// f(t) and the moments of y = z - c over {z > t}, summed over ranks by the fallback rounds.
constexpr std::size_t kPointValues = 4;  // f, n, sum y, sum y^2
struct PointStats {
  double f = 0, n = 0, s1 = 0, s2 = 0;
};

void evaluate_point(std::span<const double> scores, double alpha, double t, double c, double* out) {
  double f = 0, n = 0, s1 = 0, s2 = 0;
  for (const double s : scores) {
    const double z = (alpha - 1.0) * s;
    if (!(z > t)) continue;
    f += attn::detail::entmax_weight(z - t, alpha);
    const double y = z - c;
    n += 1;
    s1 += y;
    s2 += y * y;
  }
  out[0] = f;
  out[1] = n;
  out[2] = s1;
  out[3] = s2;
}

// A fallback head's bracket: f(lo) >= 1 >= f(hi); `c` is the moments' shift (the first lo,
// the same on every rank). Stats of an end are known once that end was evaluated.
struct Bracket {
  std::size_t head = 0;
  double c = 0, lo = 0, hi = 0;
  PointStats at_lo, at_hi;
  bool lo_known = false, hi_known = false, done = false;
  double tau = kNaN;
};

// Exact tau when no score lies in (lo, hi]: the active set is fixed, so sum_i (y_i - t)^beta
// = 1 is a polynomial in t over the summed moments (alpha 2: linear, alpha 1.5: quadratic,
// its smaller root: t must lie below every active y).
bool closed_form(const Bracket& br, double alpha, double& tau) {
  if (!br.lo_known || !br.hi_known || br.at_lo.n != br.at_hi.n || br.at_lo.n < 1) return false;
  const PointStats& m = br.at_lo;
  double t = 0;
  if (alpha == 2.0) {
    t = (m.s1 - 1.0) / m.n;
  } else if (alpha == 1.5) {
    t = (m.s1 - std::sqrt(std::max(0.0, m.s1 * m.s1 - m.n * (m.s2 - 1.0)))) / m.n;
  } else {
    return false;
  }
  tau = std::clamp(br.c + t, br.lo, br.hi);
  return true;
}

// The root of the chord through (lo, f_lo), (hi, f_hi): the last step once the bracket is
// narrow (the final p is normalised by sum p, which absorbs the residual, docs/design.md §2.1).
double chord(const Bracket& br) {
  if (!br.lo_known || !br.hi_known || br.at_lo.f == br.at_hi.f) return 0.5 * (br.lo + br.hi);
  const double w = (br.at_lo.f - 1.0) / (br.at_lo.f - br.at_hi.f);
  return std::clamp(br.lo + w * (br.hi - br.lo), br.lo, br.hi);
}

// Points of a round: both ends and K - 2 interior points in the first round (the ends' stats
// are unknown), K interior points afterwards.
double point(const Bracket& br, bool first, int k, int K) {
  return first ? br.lo + (br.hi - br.lo) * k / (K - 1)
               : br.lo + (br.hi - br.lo) * (k + 1) / (K + 1);
}

void fallback_rounds(Communicator& comm, std::span<const std::vector<double>> candidates,
                     double alpha, const EntmaxTauConfig& cfg, std::vector<Bracket>& open,
                     DecodeStats* stats) {
  const int K = cfg.batch;
  std::vector<double> buf;
  for (int round = 0; round < cfg.max_rounds; ++round) {
    std::vector<Bracket*> active;
    for (Bracket& br : open) {
      if (!br.done) active.push_back(&br);
    }
    if (active.empty()) return;
    const bool first = round == 0;
    buf.assign(active.size() * K * kPointValues, 0.0);
    for (std::size_t a = 0; a < active.size(); ++a) {
      const Bracket& br = *active[a];
      for (int k = 0; k < K; ++k) {
        evaluate_point(candidates[br.head], alpha, point(br, first, k, K), br.c,
                       buf.data() + (a * K + k) * kPointValues);
      }
    }
    comm.all_reduce(buf, ReduceOp::sum);
    if (stats) ++stats->tau_rounds;
    for (std::size_t a = 0; a < active.size(); ++a) {
      Bracket& br = *active[a];
      const Bracket old = br;
      Bracket next = br;
      for (int k = 0; k < K; ++k) {
        const double* v = buf.data() + (a * K + k) * kPointValues;
        const double x = point(old, first, k, K);
        const PointStats ps{v[0], v[1], v[2], v[3]};
        // f is non-increasing: the last point with f >= 1 is the new lo, the first below 1
        // the new hi.
        if (ps.f >= 1.0) {
          if (x >= next.lo) {
            next.lo = x;
            next.at_lo = ps;
            next.lo_known = true;
          }
        } else if (x <= next.hi) {
          next.hi = x;
          next.at_hi = ps;
          next.hi_known = true;
        }
      }
      br = next;
      double tau = 0;
      if (closed_form(br, alpha, tau)) {
        br.tau = tau;
        br.done = true;
      } else if (br.hi - br.lo <= 1e-9 * std::max(1.0, std::fabs(br.lo))) {
        br.tau = chord(br);
        br.done = true;
      }
    }
  }
  for (Bracket& br : open) {
    if (!br.done) br.tau = chord(br);  // out of rounds: the narrowest bracket's chord
  }
}

}  // namespace

void solve_global_tau(Communicator& comm, std::span<const std::vector<double>> candidates,
                      double alpha, const EntmaxTauConfig& cfg, std::span<double> tau,
                      DecodeStats* stats) {
  using enum ErrorCode;
  Mapping::entmax(alpha).validate();
  require(cfg.max_candidates >= 0, invalid_argument, "tau", "max_candidates must be >= 0, got ",
          cfg.max_candidates);
  require(cfg.batch >= 2, invalid_argument, "tau", "batch must be >= 2, got ", cfg.batch);
  require(cfg.max_rounds >= 1, invalid_argument, "tau", "max_rounds must be >= 1, got ",
          cfg.max_rounds);
  require(tau.size() == candidates.size(), shape_mismatch, "tau", "has ", tau.size(),
          " values, candidates ", candidates.size());
  const std::size_t heads = candidates.size();
  const std::size_t M = static_cast<std::size_t>(cfg.max_candidates);
  const std::size_t per_head = kHeader + M;

  // Local step: this rank's own threshold tightens its candidates to z > tau_lo_r, still a
  // superset of its part of the global support (tau_lo_r <= tau_r <= tau, §2.2).
  std::vector<double> msg(heads * per_head, 0.0);
  for (std::size_t i = 0; i < heads; ++i) {
    double* m = msg.data() + i * per_head;
    const std::vector<double>& c = candidates[i];
    m[0] = 0;
    m[1] = kNegInf;
    m[2] = kNegInf;
    if (c.empty()) continue;
    const double tau_lo = entmax_threshold(std::span<const double>(c), alpha).tau_lo;
    m[1] = tau_lo;
    std::size_t n = 0;
    for (const double s : c) {
      const double z = (alpha - 1.0) * s;
      if (!(z > tau_lo)) continue;
      if (n < M) m[kHeader + n] = s;
      ++n;
      m[2] = std::max(m[2], z);
    }
    m[0] = static_cast<double>(n);
  }

  const int R = comm.size();
  std::vector<double> all(msg.size() * static_cast<std::size_t>(R));
  comm.all_gather(msg, all);

  std::vector<Bracket> open;
  std::vector<double> unioned;
  for (std::size_t i = 0; i < heads; ++i) {
    double total = 0, lo = kNegInf, max_z = kNegInf;
    bool fits = true;
    unioned.clear();
    for (int r = 0; r < R; ++r) {
      const double* m = all.data() + static_cast<std::size_t>(r) * msg.size() + i * per_head;
      const std::size_t n = static_cast<std::size_t>(m[0]);
      total += m[0];
      lo = std::max(lo, m[1]);
      max_z = std::max(max_z, m[2]);
      fits = fits && n <= M;
      if (fits) unioned.insert(unioned.end(), m + kHeader, m + kHeader + n);
    }
    if (total == 0) {
      tau[i] = kNaN;  // no rank has a row of this head
    } else if (fits) {
      tau[i] = entmax_threshold(std::span<const double>(unioned), alpha).tau;
    } else {
      // §2.1 bracket on the candidates: f(max z - N^{1-alpha}) <= N (N^{1-alpha})^{1/(alpha-1)}
      // = 1 with N = the global candidate count; f(max_r tau_lo_r) >= 1.
      Bracket br;
      br.head = i;
      br.c = lo;
      br.lo = lo;
      br.hi = std::max(lo, max_z - std::pow(total, 1.0 - alpha));
      open.push_back(br);
    }
  }
  if (stats) stats->fallback_heads += static_cast<int>(open.size());
  fallback_rounds(comm, candidates, alpha, cfg, open, stats);
  for (const Bracket& br : open) tau[br.head] = br.tau;
}

}  // namespace masskv::dist
