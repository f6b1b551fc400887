// f64 reference of prefill: for every query, plain loops over the keys it may attend.
#include <cmath>
#include <limits>
#include <vector>

#include "attn/prefill_mask.hpp"
#include "attn/reference_mapping.hpp"
#include "attn/rows.hpp"
#include "attn/validate_args.hpp"
#include "masskv/attn/prefill.hpp"
#include "masskv/error.hpp"

namespace masskv::attn {

void prefill_reference(const PrefillArgs& args, std::span<double> out,
                       std::span<double> lse_or_tau) {
  const detail::Geometry geo = detail::validate(args);
  const int d = geo.head_dim;
  const std::size_t total = static_cast<std::size_t>(args.q_indptr[geo.batch]);
  require(out.size() == total * geo.num_q_heads * d, ErrorCode::shape_mismatch, "out",
          "reference output needs total queries * q heads * head_dim doubles");
  require(lse_or_tau.empty() || lse_or_tau.size() == total * geo.num_q_heads,
          ErrorCode::shape_mismatch, "lse_or_tau", "reference needs 0 or total * q heads doubles");
  const detail::RowSource src(args.cache, nullptr);
  std::vector<const void*> k, v;
  std::vector<const double*> kk, vv;
  std::vector<double> s, qd(d);
  for (int b = 0; b < geo.batch; ++b) {
    const std::int64_t length = args.cache.table.length(b, args.cache.page_size);
    const std::int64_t nq = args.q_indptr[b + 1] - args.q_indptr[b];
    const detail::PrefillMask mask(args.block_mask, b, length, nq);
    for (int h = 0; h < geo.num_kv_heads; ++h) {
      const int units = src.units(b, h);
      k.resize(length);
      v.resize(length);
      src.gather(b, h, 0, units, k.data(), v.data(), nullptr);
      const std::vector<double> kd = detail::ref_rows(k, args.cache.dtype, d);
      const std::vector<double> vd = detail::ref_rows(v, args.cache.dtype, d);
      for (std::int64_t i = 0; i < nq; ++i) {
        kk.clear();
        vv.clear();
        for (std::int64_t key = 0; key < length; ++key) {
          if (!mask.allowed(i, key)) continue;
          kk.push_back(kd.data() + key * d);
          vv.push_back(vd.data() + key * d);
        }
        const std::int64_t row = args.q_indptr[b] + i;
        for (int j = 0; j < geo.group; ++j) {
          const int hq = h * geo.group + j;
          const float* q = args.q.row(static_cast<int>(row), hq);
          for (int c = 0; c < d; ++c) qd[c] = q[c];
          s.resize(kk.size());
          for (std::size_t r = 0; r < kk.size(); ++r) {
            s[r] = static_cast<double>(geo.scale) * detail::ref_dot(qd.data(), kk[r], d);
          }
          const std::size_t at = static_cast<std::size_t>(row) * geo.num_q_heads + hq;
          const double stat = detail::ref_attend(s, vv, d, args.mapping, out.data() + at * d);
          if (!lse_or_tau.empty()) lse_or_tau[at] = stat;
        }
      }
    }
  }
}

}  // namespace masskv::attn
