// f64 reference of decode: plain loops over the (selected) tokens, no chunking, and its own
// entmax bisection so it shares nothing with the fast solvers (docs/design.md §6).
#include <cmath>
#include <limits>
#include <vector>

#include "attn/reference_mapping.hpp"
#include "attn/rows.hpp"
#include "attn/validate_args.hpp"
#include "masskv/attn/decode.hpp"
#include "masskv/error.hpp"

namespace masskv::attn {

void decode_reference(const DecodeArgs& args, std::span<double> out, std::span<double> lse_or_tau) {
  const detail::Geometry geo = detail::validate(args);
  const int d = geo.head_dim;
  const std::size_t heads = static_cast<std::size_t>(geo.batch) * geo.num_q_heads;
  require(out.size() == heads * d, ErrorCode::shape_mismatch, "out",
          "reference output needs batch * q heads * head_dim doubles");
  require(lse_or_tau.empty() || lse_or_tau.size() == heads, ErrorCode::shape_mismatch, "lse_or_tau",
          "reference needs 0 or batch * q heads doubles");
  const detail::RowSource src(args.cache, args.selection);
  std::vector<const void*> k, v;
  std::vector<const double*> v64;
  std::vector<double> s, qd(d);
  for (int b = 0; b < geo.batch; ++b) {
    for (int h = 0; h < geo.num_kv_heads; ++h) {
      const int units = src.units(b, h);
      const int n = src.count(b, h, 0, units);
      k.resize(n);
      v.resize(n);
      s.resize(n);
      src.gather(b, h, 0, units, k.data(), v.data(), nullptr);
      const std::vector<double> kd = detail::ref_rows(k, args.cache.dtype, d);
      const std::vector<double> vd = detail::ref_rows(v, args.cache.dtype, d);
      v64.resize(n);
      for (int r = 0; r < n; ++r) v64[r] = vd.data() + static_cast<std::size_t>(r) * d;
      for (int j = 0; j < geo.group; ++j) {
        const int hq = h * geo.group + j;
        const float* q = args.q.row(b, hq);
        for (int c = 0; c < d; ++c) qd[c] = q[c];
        for (int r = 0; r < n; ++r) {
          s[r] = static_cast<double>(geo.scale) *
                 detail::ref_dot(qd.data(), kd.data() + static_cast<std::size_t>(r) * d, d);
        }
        double* o = out.data() + (static_cast<std::size_t>(b) * geo.num_q_heads + hq) * d;
        const double stat = detail::ref_attend(s, v64, d, args.mapping, o);
        if (!lse_or_tau.empty())
          lse_or_tau[static_cast<std::size_t>(b) * geo.num_q_heads + hq] = stat;
      }
    }
  }
}

}  // namespace masskv::attn
