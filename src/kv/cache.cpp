// PagedKVCache: page pool, free list, reference-counted sharing between forks, and the page
// summaries of docs/design.md §3 (min/max for the §2.3 bound, mean/M2 for the §2.4 model,
// max ||v|| for the §2.5 error bound), updated in O(d) per appended token.
#include "masskv/kv/cache.hpp"
#include "masskv/kv/page_codes.hpp"
#include "kv/page_codes_math.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>

#include "masskv/error.hpp"
#include "masskv/kv/key_formats.hpp"

namespace masskv::kv {

namespace {

constexpr std::size_t kPoolAlignment = 64;  // one cache line: SIMD loads of a page never split

struct FreeDeleter {
  void operator()(std::byte* p) const noexcept { std::free(p); }
};
using PoolBuffer = std::unique_ptr<std::byte, FreeDeleter>;

PoolBuffer allocate_zeroed(std::size_t bytes) {
  const std::size_t rounded = (bytes + kPoolAlignment - 1) / kPoolAlignment * kPoolAlignment;
  PoolBuffer p(static_cast<std::byte*>(std::aligned_alloc(kPoolAlignment, rounded)));
  require(p != nullptr, ErrorCode::out_of_memory, "capacity_pages", "cannot allocate ", rounded,
          " bytes for the page pool");
  std::memset(p.get(), 0, rounded);
  return p;
}

bool is_pow2_page(int p) { return p >= 1 && p <= 256 && (p & (p - 1)) == 0; }

// Rounds a non-negative f64 up to f32, so a stored max ||v|| never understates the true
// one (it enters the error bound of docs/design.md §2.5).
float round_up_to_f32(double x) {
  float f = static_cast<float>(x);
  if (static_cast<double>(f) < x) f = std::nextafter(f, std::numeric_limits<float>::infinity());
  return f;
}

// One comparison rule for min/max, shared by the incremental update and the recomputation,
// so both produce the same bits (including the sign of zero).
inline float min_rule(float x, float m) { return x < m ? x : m; }
inline float max_rule(float x, float m) { return x > m ? x : m; }

}  // namespace

void CacheConfig::validate() const {
  using enum ErrorCode;
  require(num_kv_heads > 0, invalid_argument, "num_kv_heads", "must be > 0, got ", num_kv_heads);
  require(head_dim > 0, invalid_argument, "head_dim", "must be > 0, got ", head_dim);
  require(is_pow2_page(page_size), invalid_argument, "page_size",
          "must be a power of two in [1, 256], got ", page_size);
  require(capacity_pages > 0, invalid_argument, "capacity_pages", "must be > 0, got ",
          capacity_pages);
  require(dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16, invalid_argument,
          "dtype", "unknown dtype ", static_cast<int>(dtype));
  require(layout == Layout::HND || layout == Layout::NHD, invalid_argument, "layout",
          "unknown layout ", static_cast<int>(layout));
  require(selector_key_format <= KeyFormat::mxfp8, invalid_argument, "selector_key_format",
          "unknown selector key format ", static_cast<int>(selector_key_format));
  if (int4_selector_keys) {
    require(selector_key_format == KeyFormat::int4, invalid_argument, "int4_selector_keys",
            "asks for int4 selector keys, but selector_key_format is ",
            to_string(selector_key_format), " (set selector_keys instead)");
    check_key_dim(KeyFormat::int4, head_dim, "int4_selector_keys");
  }
  if (selector_keys) check_key_dim(selector_key_format, head_dim, "selector_key_format");
  require(key_row_groups >= 0 && key_row_dim >= 0 && (key_row_groups > 0) == (key_row_dim > 0),
          invalid_argument, "key_row_groups", "key rows need groups > 0 and dim > 0 (or both 0), got ",
          key_row_groups, " x ", key_row_dim);
  require(key_row_format <= RowFormat::mxfp8, invalid_argument, "key_row_format",
          "unknown format ", static_cast<int>(key_row_format));
  if (key_row_groups > 0) check_row_dim(key_row_format, key_row_dim, "key_row_dim");
}

// One step of Welford's update (kv/page_codes_math.hpp, shared with the CUDA encoder): the
// page summaries' (from their f32 state) and a sequence's moments (page codes' spread rows)
// both take it.
using codes_math::welford_step;

struct PagedKVCache::Impl {
  struct Sequence {
    std::vector<std::int32_t> pages;  // physical ids in token order
    std::int64_t length = 0;
    bool alive = false;
    // With page codes: Welford's mean and M2 of every stored key, [head][d] (f64; sized by
    // create), whose standard deviations go to the last page's row of cspread.
    std::vector<double> kmean, km2;
  };

  CacheConfig cfg;
  PagedKVView pool;             // pointers, geometry and strides; the table is filled per view()
  std::int64_t page_elems = 0;  // elements of one page of K (or V), all heads
  PoolBuffer k, v;
  std::vector<float> smin, smax, smean, sm2, svnorm;  // [page][head][d], svnorm [page][head]
  std::vector<std::int32_t> count, refcount;          // [page]
  std::vector<std::uint8_t> sk;                       // selector key codes [page][head][slot][.]
  std::vector<std::uint8_t> sk_scales;                // and their scales [page][head][slot][.]
  int sk_code_bytes = 0, sk_scale_bytes = 0;          // per row
  std::vector<std::uint8_t> pcodes;                   // page codes [page][head][slot][.]
  std::size_t pcode_row = 0;                          // bytes of one row of page codes
  std::vector<std::uint8_t> prange_min, prange_max;   // page code ranges [page][head][d]
  std::vector<float> prange_grid;                     // [page][head][2]: lo, step
  std::vector<std::uint8_t> ccodes, cranges;          // channel-major copies (PageCodesView)
  std::size_t cword = 0;                              // bytes of one channel of one page
  std::vector<float> cspread;                         // [page][head][d] (PageCodesView)
  std::vector<float> pcode_key, pcode_lo, pcode_hi;   // scratch: a key, a range's bounds (f32)
  std::vector<std::uint8_t> pr_a, pr_b;               // scratch: a new range's codes
  std::vector<std::byte> krows;                       // key rows [page][group][slot][row]
  std::size_t rows_per_page = 0;                      // bytes of one page of key rows
  std::vector<float> key_row;                         // scratch: one stored key in f32
  std::vector<std::int32_t> free_list;                // stack of free page ids
  std::vector<Sequence> seqs;                         // indexed by SeqId; ids are never reused

  explicit Impl(const CacheConfig& c) : cfg(c) {
    cfg.validate();
    const int H = cfg.num_kv_heads, d = cfg.head_dim, P = cfg.page_size;
    const std::int64_t pages = cfg.capacity_pages;
    page_elems = static_cast<std::int64_t>(H) * P * d;
    const std::size_t bytes = static_cast<std::size_t>(pages * page_elems) * dtype_size(cfg.dtype);
    k = allocate_zeroed(bytes);
    v = allocate_zeroed(bytes);
    pool.k = k.get();
    pool.v = v.get();
    pool.dtype = cfg.dtype;
    pool.num_pages = cfg.capacity_pages;
    pool.num_kv_heads = H;
    pool.page_size = P;
    pool.head_dim = d;
    pool.set_layout(cfg.layout);

    const std::size_t sum_elems = static_cast<std::size_t>(pages) * H * d;
    smin.assign(sum_elems, std::numeric_limits<float>::infinity());
    smax.assign(sum_elems, -std::numeric_limits<float>::infinity());
    smean.assign(sum_elems, 0.0f);
    sm2.assign(sum_elems, 0.0f);
    svnorm.assign(static_cast<std::size_t>(pages) * H, 0.0f);
    count.assign(static_cast<std::size_t>(pages), 0);
    if (cfg.has_selector_keys()) {
      const std::size_t rows = static_cast<std::size_t>(pages) * H * P;
      sk_code_bytes = code_bytes(cfg.selector_key_format, d);
      sk_scale_bytes = scale_bytes(cfg.selector_key_format, d);
      sk.assign(rows * static_cast<std::size_t>(sk_code_bytes), 0);
      sk_scales.assign(rows * static_cast<std::size_t>(sk_scale_bytes), 0);
      key_row.resize(static_cast<std::size_t>(d));
    }
    if (cfg.page_codes) {
      pcode_row = static_cast<std::size_t>(page_code_bytes(d));
      pcodes.assign(static_cast<std::size_t>(pages) * H * P * pcode_row, 0);
      prange_min.assign(static_cast<std::size_t>(pages) * H * d, 0);
      prange_max.assign(prange_min.size(), 0);
      prange_grid.assign(static_cast<std::size_t>(pages) * H * 2, 0.0f);
      cword = static_cast<std::size_t>((P + 3) / 4);
      ccodes.assign(static_cast<std::size_t>(pages) * H * d * cword, 0);
      cranges.assign(static_cast<std::size_t>(pages) * H * d * 2, 0);
      cspread.assign(static_cast<std::size_t>(pages) * H * d, 0.0f);
      for (auto* buf : {&pcode_key, &pcode_lo, &pcode_hi}) buf->resize(static_cast<std::size_t>(d));
      pr_a.resize(static_cast<std::size_t>(d));
      pr_b.resize(static_cast<std::size_t>(d));
    }
    if (cfg.key_row_groups > 0) {
      rows_per_page = static_cast<std::size_t>(cfg.key_row_groups) * static_cast<std::size_t>(P) *
                      row_bytes(cfg.key_row_format, cfg.key_row_dim);
      krows.assign(rows_per_page * static_cast<std::size_t>(pages), std::byte{0});
    }
    refcount.assign(static_cast<std::size_t>(pages), 0);
    free_list.reserve(static_cast<std::size_t>(pages));
    for (std::int32_t p = cfg.capacity_pages - 1; p >= 0; --p) free_list.push_back(p);
  }

  Sequence& seq_at(SeqId id) {
    require(id >= 0 && static_cast<std::size_t>(id) < seqs.size() && seqs[id].alive,
            ErrorCode::out_of_range, "seq", "unknown or freed sequence id ", id);
    return seqs[id];
  }
  const Sequence& seq_at(SeqId id) const { return const_cast<Impl*>(this)->seq_at(id); }

  std::size_t sum_at(std::int32_t page, int head) const {
    return (static_cast<std::size_t>(page) * cfg.num_kv_heads + head) * cfg.head_dim;
  }
  std::byte* page_bytes(std::byte* base, std::int32_t page) const {
    return base + static_cast<std::size_t>(page * page_elems) * dtype_size(cfg.dtype);
  }

  // Takes a page off the free list with empty summaries. Its slots are zeroed so a page's
  // unwritten slots never hold a previous owner's data (kernels mask them anyway, §3).
  std::int32_t take_page() {
    const std::int32_t p = free_list.back();
    free_list.pop_back();
    refcount[p] = 1;
    count[p] = 0;
    const std::size_t bytes = static_cast<std::size_t>(page_elems) * dtype_size(cfg.dtype);
    std::memset(page_bytes(k.get(), p), 0, bytes);
    std::memset(page_bytes(v.get(), p), 0, bytes);
    const std::size_t n = static_cast<std::size_t>(cfg.num_kv_heads) * cfg.head_dim;
    std::fill_n(smin.begin() + sum_at(p, 0), n, std::numeric_limits<float>::infinity());
    std::fill_n(smax.begin() + sum_at(p, 0), n, -std::numeric_limits<float>::infinity());
    std::fill_n(smean.begin() + sum_at(p, 0), n, 0.0f);
    std::fill_n(sm2.begin() + sum_at(p, 0), n, 0.0f);
    std::fill_n(svnorm.begin() + static_cast<std::size_t>(p) * cfg.num_kv_heads, cfg.num_kv_heads,
                0.0f);
    std::fill_n(krows.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(p) * rows_per_page), rows_per_page,
                std::byte{0});
    return p;
  }

  void release_page(std::int32_t p) {
    if (--refcount[p] == 0) free_list.push_back(p);
  }

  // Copy-on-write of a shared partial page (docs/design.md §3): data and summaries move to a
  // fresh page owned by `s` alone.
  void copy_last_page(Sequence& s) {
    const std::int32_t old = s.pages.back();
    const std::int32_t p = take_page();
    const std::size_t bytes = static_cast<std::size_t>(page_elems) * dtype_size(cfg.dtype);
    std::memcpy(page_bytes(k.get(), p), page_bytes(k.get(), old), bytes);
    std::memcpy(page_bytes(v.get(), p), page_bytes(v.get(), old), bytes);
    const std::size_t n = static_cast<std::size_t>(cfg.num_kv_heads) * cfg.head_dim;
    for (auto* arr : {&smin, &smax, &smean, &sm2}) {
      std::copy_n(arr->begin() + sum_at(old, 0), n, arr->begin() + sum_at(p, 0));
    }
    const std::size_t H = static_cast<std::size_t>(cfg.num_kv_heads);
    std::copy_n(svnorm.begin() + old * H, H, svnorm.begin() + p * H);
    count[p] = count[old];
    if (cfg.has_selector_keys()) {
      const std::size_t rows = static_cast<std::size_t>(cfg.num_kv_heads) * cfg.page_size;
      const std::size_t nb = rows * static_cast<std::size_t>(sk_code_bytes);
      const std::size_t ns = rows * static_cast<std::size_t>(sk_scale_bytes);
      std::copy_n(sk.begin() + old * nb, nb, sk.begin() + p * nb);
      std::copy_n(sk_scales.begin() + old * ns, ns, sk_scales.begin() + p * ns);
    }
    if (cfg.page_codes) {
      const std::size_t nb = static_cast<std::size_t>(cfg.num_kv_heads) * cfg.page_size * pcode_row;
      std::copy_n(pcodes.begin() + static_cast<std::ptrdiff_t>(old * nb), nb,
                  pcodes.begin() + static_cast<std::ptrdiff_t>(p * nb));
      const std::size_t nr = static_cast<std::size_t>(cfg.num_kv_heads) * cfg.head_dim;
      std::copy_n(prange_min.begin() + static_cast<std::ptrdiff_t>(old * nr), nr,
                  prange_min.begin() + static_cast<std::ptrdiff_t>(p * nr));
      std::copy_n(prange_max.begin() + static_cast<std::ptrdiff_t>(old * nr), nr,
                  prange_max.begin() + static_cast<std::ptrdiff_t>(p * nr));
      for (int h = 0; h < cfg.num_kv_heads; ++h) {
        for (int c = 0; c < cfg.head_dim; ++c) {
          std::copy_n(ccodes.begin() + static_cast<std::ptrdiff_t>(chan_at(old, h, c) * cword), cword,
                      ccodes.begin() + static_cast<std::ptrdiff_t>(chan_at(p, h, c) * cword));
          std::copy_n(cranges.begin() + static_cast<std::ptrdiff_t>(chan_at(old, h, c) * 2), 2,
                      cranges.begin() + static_cast<std::ptrdiff_t>(chan_at(p, h, c) * 2));
        }
      }
      std::copy_n(cspread.begin() + static_cast<std::ptrdiff_t>(old * nr), nr,
                  cspread.begin() + static_cast<std::ptrdiff_t>(p * nr));
      const std::size_t ng = static_cast<std::size_t>(cfg.num_kv_heads) * 2;
      std::copy_n(prange_grid.begin() + static_cast<std::ptrdiff_t>(old * ng), ng,
                  prange_grid.begin() + static_cast<std::ptrdiff_t>(p * ng));
    }
    std::copy_n(krows.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(old) * rows_per_page), rows_per_page,
                krows.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(p) * rows_per_page));
    release_page(old);
    s.pages.back() = p;
  }

  template <class T>
  void check_input(std::span<const float> x, const char* name) const {
    for (std::size_t i = 0; i < x.size(); ++i) {
      require(std::isfinite(x[i]), ErrorCode::non_finite, name, name, "[", i, "] = ", x[i],
              " is not finite");
      // A finite f32 can overflow f16: an inf key would poison the summaries and bounds.
      require(std::isfinite(to_f32(from_f32<T>(x[i]))), ErrorCode::non_finite, name, name, "[", i,
              "] = ", x[i], " overflows ", to_string(cfg.dtype));
    }
    if (cfg.has_selector_keys() && name[0] == 'k') {  // int4: f16(max|k| / 7) must be finite
      const KeyFormat f = cfg.selector_key_format;
      for (std::size_t i = 0; i < x.size(); ++i) {
        require(key_encodable(f, to_f32(from_f32<T>(x[i]))), ErrorCode::out_of_range, name, name,
                "[", i, "] = ", x[i], " exceeds the ", to_string(f), " selector key range");
      }
    }
  }

  // Writes one token's k and v for every head into `slot` of `page` and folds the stored
  // (converted) key into the page summaries: min/max exactly, mean/M2 by Welford's update
  // computed in f64 from the f32 state, max ||v|| rounded up; with page codes also into the
  // moments of `seq` (whose length counts the token already).
  template <class T>
  void write_token(std::int32_t page, int slot, const float* k_tok, const float* v_tok,
                   Sequence& seq) {
    const int H = cfg.num_kv_heads, d = cfg.head_dim;
    T* kp = static_cast<T*>(static_cast<void*>(k.get()));
    T* vp = static_cast<T*>(static_cast<void*>(v.get()));
    const double n = count[page] + 1;
    const double n_seq = static_cast<double>(seq.length);
    for (int h = 0; h < H; ++h) {
      T* ks = kp + pool.offset(page, h, slot);
      T* vs = vp + pool.offset(page, h, slot);
      const float* kin = k_tok + static_cast<std::size_t>(h) * d;
      const float* vin = v_tok + static_cast<std::size_t>(h) * d;
      const std::size_t base = sum_at(page, h);
      float* mn = smin.data() + base;
      float* mx = smax.data() + base;
      float* mean = smean.data() + base;
      float* m2 = sm2.data() + base;
      double* seq_mean = cfg.page_codes ? seq.kmean.data() + static_cast<std::size_t>(h) * d : nullptr;
      double* seq_m2 = cfg.page_codes ? seq.km2.data() + static_cast<std::size_t>(h) * d : nullptr;
      double vnorm2 = 0;
      for (int c = 0; c < d; ++c) {
        ks[c] = from_f32<T>(kin[c]);
        vs[c] = from_f32<T>(vin[c]);
        const float x = to_f32(ks[c]);
        mn[c] = min_rule(x, mn[c]);
        mx[c] = max_rule(x, mx[c]);
        double page_mean = mean[c], page_m2 = m2[c];
        welford_step(x, n, page_mean, page_m2);
        mean[c] = static_cast<float>(page_mean);
        m2[c] = static_cast<float>(page_m2);
        if (seq_mean != nullptr) welford_step(x, n_seq, seq_mean[c], seq_m2[c]);
        const double y = to_f32(vs[c]);
        vnorm2 += y * y;
      }
      float& vmax = svnorm[static_cast<std::size_t>(page) * H + h];
      vmax = std::max(vmax, round_up_to_f32(std::sqrt(vnorm2)));
      if (cfg.page_codes) encode_codes<T>(page, h, slot);
      if (cfg.has_selector_keys()) {
        for (int c = 0; c < d; ++c) key_row[c] = to_f32(ks[c]);
        const std::size_t r = (static_cast<std::size_t>(page) * H + h) * cfg.page_size +
                              static_cast<std::size_t>(slot);
        quantize_row(cfg.selector_key_format, key_row.data(), d,
                     sk.data() + r * static_cast<std::size_t>(sk_code_bytes),
                     sk_scales.data() + r * static_cast<std::size_t>(sk_scale_bytes));
      }
    }
    ++count[page];
  }

  // Page codes of (page, head) after slot `last` was written: the range from the current
  // summary onto its 8-bit grid; when it moved, every row [0, last] is encoded again, else row
  // `last` alone (kv/page_codes.hpp).
  template <class T>
  void encode_codes(std::int32_t page, int h, int last) {
    const T* kp = static_cast<const T*>(static_cast<const void*>(k.get()));
    const std::size_t base = sum_at(page, h);
    const int d = cfg.head_dim;
    const std::size_t ph = static_cast<std::size_t>(page) * cfg.num_kv_heads + h;
    float grid[2];
    round_range8(smin.data() + base, smax.data() + base, d, pr_a.data(), pr_b.data(), grid);
    std::uint8_t* a = prange_min.data() + ph * d;
    std::uint8_t* b = prange_max.data() + ph * d;
    float* g = prange_grid.data() + 2 * ph;
    const bool moved = last == 0 || g[0] != grid[0] || g[1] != grid[1] ||
                       !std::equal(pr_a.begin(), pr_a.end(), a) ||
                       !std::equal(pr_b.begin(), pr_b.end(), b);
    if (moved) {
      std::copy(pr_a.begin(), pr_a.end(), a);
      std::copy(pr_b.begin(), pr_b.end(), b);
      g[0] = grid[0];
      g[1] = grid[1];
    }
    range_bounds({g[0], g[1], a, b}, d, pcode_lo.data(), pcode_hi.data());
    for (int slot = moved ? 0 : last; slot <= last; ++slot) {
      const T* ks = kp + pool.offset(page, h, slot);
      for (int c = 0; c < d; ++c) pcode_key[static_cast<std::size_t>(c)] = to_f32(ks[c]);
      encode_page_codes(pcode_key.data(), pcode_lo.data(), pcode_hi.data(), d,
                        pcodes.data() + (ph * cfg.page_size + slot) * pcode_row);
    }
    copy_to_channels(page, h, moved ? 0 : last, last);
  }

  // Index of (page, head, channel) in the channel-major copies: [head][channel][page].
  std::size_t chan_at(std::int32_t page, int h, int c) const {
    return (static_cast<std::size_t>(h) * cfg.head_dim + static_cast<std::size_t>(c)) *
               static_cast<std::size_t>(cfg.capacity_pages) +
           static_cast<std::size_t>(page);
  }

  // The channel-major copy of (page, head)'s ranges and of its rows [from, last] (PageCodesView).
  void copy_to_channels(std::int32_t page, int h, int from, int last) {
    const int d = cfg.head_dim;
    const std::size_t ph = static_cast<std::size_t>(page) * cfg.num_kv_heads + h;
    for (int c = 0; c < d; ++c) {
      const std::size_t at = chan_at(page, h, c);
      cranges[2 * at] = prange_min[ph * d + c];
      cranges[2 * at + 1] = prange_max[ph * d + c];
      std::uint8_t* word = ccodes.data() + at * cword;
      for (int slot = from; slot <= last; ++slot) {
        const std::uint8_t* row = pcodes.data() + (ph * cfg.page_size + slot) * pcode_row;
        const int code = code_of(row, c);
        std::uint8_t& byte = word[slot >> 2];
        const int shift = 2 * (slot & 3);
        byte = static_cast<std::uint8_t>((byte & ~(3 << shift)) | (code << shift));
      }
    }
  }

  // The standard deviations of s's keys so far into its last page's row (PageCodesView).
  void write_spread(const Sequence& s) {
    const std::size_t hd = static_cast<std::size_t>(cfg.num_kv_heads) * cfg.head_dim;
    float* row = cspread.data() + static_cast<std::size_t>(s.pages.back()) * hd;
    const double n = static_cast<double>(s.length);
    for (std::size_t i = 0; i < hd; ++i) row[i] = static_cast<float>(std::sqrt(s.km2[i] / n));
  }

  bool shared_partial(const Sequence& s) const {
    return s.length % cfg.page_size != 0 && refcount[s.pages.back()] > 1;
  }

  // Fresh pages for n more tokens, plus the copy of a shared partial last page.
  std::int64_t pages_needed(const Sequence& s, std::int64_t n) const {
    const int P = cfg.page_size;
    const int used_in_last = static_cast<int>(s.length % P);
    const int room = used_in_last == 0 ? 0 : P - used_in_last;
    const std::int64_t fresh = n > room ? (n - room + P - 1) / P : 0;
    return fresh + (shared_partial(s) ? 1 : 0);
  }

  // The key rows of one token into `slot` of `page`, group after group.
  void write_rows(std::int32_t page, int slot, const float* x) {
    const int G = cfg.key_row_groups, dim = cfg.key_row_dim;
    const std::size_t rb = row_bytes(cfg.key_row_format, dim);
    for (int g = 0; g < G; ++g) {
      // The layout of KeyRowsView::row.
      const std::size_t r = (static_cast<std::size_t>(page) * static_cast<std::size_t>(G) +
                             static_cast<std::size_t>(g)) *
                                static_cast<std::size_t>(cfg.page_size) +
                            static_cast<std::size_t>(slot);
      encode_row(cfg.key_row_format, x + static_cast<std::size_t>(g) * static_cast<std::size_t>(dim),
                 dim, krows.data() + r * rb);
    }
  }

  KeyRowsView key_rows_view() const {
    if (cfg.key_row_groups == 0) return {};
    return {krows.data(), cfg.key_row_format, cfg.capacity_pages, cfg.key_row_groups,
            cfg.page_size, cfg.key_row_dim};
  }

  template <class T>
  void append(SeqId id, std::span<const float> kin, std::span<const float> vin, int n,
              std::span<const float> rin) {
    Sequence& s = seq_at(id);
    require(n >= 0, ErrorCode::invalid_argument, "n", "must be >= 0, got ", n);
    const std::size_t tok = static_cast<std::size_t>(cfg.num_kv_heads) * cfg.head_dim;
    const std::size_t want = static_cast<std::size_t>(n) * tok;
    require(kin.size() == want, ErrorCode::shape_mismatch, "k", "has ", kin.size(),
            " values, expected n * num_kv_heads * head_dim = ", want);
    require(vin.size() == want, ErrorCode::shape_mismatch, "v", "has ", vin.size(),
            " values, expected n * num_kv_heads * head_dim = ", want);
    const std::size_t row_tok =
        static_cast<std::size_t>(cfg.key_row_groups) * static_cast<std::size_t>(cfg.key_row_dim);
    require(rin.size() == static_cast<std::size_t>(n) * row_tok, ErrorCode::shape_mismatch,
            "key_rows", "has ", rin.size(), " values, expected n * key_row_groups * key_row_dim = ",
            static_cast<std::size_t>(n) * row_tok);
    if (n == 0) return;
    check_input<T>(kin, "k");
    check_input<T>(vin, "v");
    for (std::size_t i = 0; i < rin.size(); ++i) {
      require(std::isfinite(rin[i]), ErrorCode::non_finite, "key_rows", "key_rows[", i, "] = ",
              rin[i], " is not finite");
    }

    // All-or-nothing: count every page this append takes before touching anything.
    const int P = cfg.page_size;
    const bool cow = shared_partial(s);
    const std::int64_t needed = pages_needed(s, n);
    require(needed <= static_cast<std::int64_t>(free_list.size()), ErrorCode::out_of_memory,
            "capacity_pages", "appending ", n, " tokens needs ", needed, " free pages, ",
            free_list.size(), " of ", cfg.capacity_pages, " are free");

    if (cow) copy_last_page(s);
    for (int t = 0; t < n; ++t) {
      const int slot = static_cast<int>(s.length % P);
      if (slot == 0) s.pages.push_back(take_page());
      ++s.length;
      write_token<T>(s.pages.back(), slot, kin.data() + t * tok, vin.data() + t * tok, s);
      if (row_tok > 0) write_rows(s.pages.back(), slot, rin.data() + static_cast<std::size_t>(t) * row_tok);
      if (cfg.page_codes && (slot == P - 1 || t == n - 1)) write_spread(s);
    }
  }
};

PagedKVCache::PagedKVCache(const CacheConfig& config) : impl_(std::make_unique<Impl>(config)) {}
PagedKVCache::~PagedKVCache() = default;
PagedKVCache::PagedKVCache(PagedKVCache&&) noexcept = default;
PagedKVCache& PagedKVCache::operator=(PagedKVCache&&) noexcept = default;

const CacheConfig& PagedKVCache::config() const { return impl_->cfg; }

SeqId PagedKVCache::create() {
  require(impl_->seqs.size() < static_cast<std::size_t>(std::numeric_limits<SeqId>::max()),
          ErrorCode::out_of_range, "seq", "sequence ids exhausted");
  // Page codes: the sequence's key moments, one per head and channel.
  const std::size_t hd = impl_->cfg.page_codes ? static_cast<std::size_t>(impl_->cfg.num_kv_heads) *
                                                     static_cast<std::size_t>(impl_->cfg.head_dim)
                                               : 0;
  impl_->seqs.push_back({{}, 0, true, std::vector<double>(hd), std::vector<double>(hd)});
  return static_cast<SeqId>(impl_->seqs.size() - 1);
}

SeqId PagedKVCache::fork(SeqId parent) {
  // Copy the parent's state before create(): push_back may move the parent's storage.
  const Impl::Sequence p = impl_->seq_at(parent);
  const SeqId child = create();
  for (std::int32_t page : p.pages) ++impl_->refcount[page];
  impl_->seqs[child].pages = p.pages;
  impl_->seqs[child].length = p.length;
  impl_->seqs[child].kmean = p.kmean;
  impl_->seqs[child].km2 = p.km2;
  return child;
}

void PagedKVCache::free(SeqId seq) {
  Impl::Sequence& s = impl_->seq_at(seq);
  for (std::int32_t page : s.pages) impl_->release_page(page);
  s.pages.clear();
  s.pages.shrink_to_fit();
  s.length = 0;
  s.kmean = {};
  s.km2 = {};
  s.alive = false;
}

void PagedKVCache::append(SeqId seq, std::span<const float> k, std::span<const float> v, int n,
                          std::span<const float> key_rows) {
  visit_dtype(impl_->cfg.dtype, [&](auto tag) {
    using T = decltype(tag);
    impl_->append<T>(seq, k, v, n, key_rows);
  });
}

std::int64_t PagedKVCache::length(SeqId seq) const { return impl_->seq_at(seq).length; }
int PagedKVCache::free_pages() const { return static_cast<int>(impl_->free_list.size()); }
std::int64_t PagedKVCache::pages_needed(SeqId seq, std::int64_t n) const {
  return pages_needed(std::span<const SeqId>(&seq, 1), n);
}

std::int64_t PagedKVCache::pages_needed(std::span<const SeqId> seqs, std::int64_t n) const {
  require(n >= 0, ErrorCode::invalid_argument, "n", "must be >= 0, got ", n);
  std::vector<SeqId> sorted(seqs.begin(), seqs.end());
  std::sort(sorted.begin(), sorted.end());
  const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
  require(twice == sorted.end(), ErrorCode::invalid_argument, "seqs", "sequence id ",
          twice == sorted.end() ? 0 : *twice, " appears twice");
  std::int64_t total = 0;
  std::map<std::int32_t, std::int64_t> writers;  // shared partial page -> its writers here
  for (const SeqId id : seqs) {
    const Impl::Sequence& s = impl_->seq_at(id);
    const bool shared = impl_->shared_partial(s);
    total += impl_->pages_needed(s, n) - (shared ? 1 : 0);
    if (shared) ++writers[s.pages.back()];
  }
  for (const auto& [page, k] : writers) {
    total += std::min<std::int64_t>(k, impl_->refcount[static_cast<std::size_t>(page)] - 1);
  }
  return total;
}
bool PagedKVCache::alive(SeqId seq) const {
  return seq >= 0 && static_cast<std::size_t>(seq) < impl_->seqs.size() && impl_->seqs[seq].alive;
}

PageTableStorage PagedKVCache::page_table(std::span<const SeqId> seqs) const {
  require(!seqs.empty(), ErrorCode::invalid_argument, "seqs",
          "a page table needs at least one sequence");
  PageTableStorage t;
  t.indptr.reserve(seqs.size() + 1);
  t.last_page_len.reserve(seqs.size());
  t.indptr.push_back(0);
  const int P = impl_->cfg.page_size;
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    const Impl::Sequence& s = impl_->seq_at(seqs[b]);
    require(s.length > 0, ErrorCode::invalid_argument, "seqs", "seqs[", b, "] = sequence ", seqs[b],
            " is empty (length 0): a kernel page table needs >= 1 token per sequence");
    t.indices.insert(t.indices.end(), s.pages.begin(), s.pages.end());
    t.indptr.push_back(static_cast<std::int32_t>(t.indices.size()));
    t.last_page_len.push_back(static_cast<std::int32_t>((s.length - 1) % P + 1));
  }
  return t;
}

PagedKVView PagedKVCache::view(const PageTableStorage& table) const {
  PagedKVView v = impl_->pool;
  v.table = table.table();
  return v;
}

SummariesView PagedKVCache::summaries() const {
  const Impl& m = *impl_;
  return {m.smin.data(),   m.smax.data(),        m.smean.data(),     m.sm2.data(),  m.count.data(),
          m.svnorm.data(), m.cfg.capacity_pages, m.cfg.num_kv_heads, m.cfg.head_dim};
}

PageCodesView PagedKVCache::page_codes() const {
  const Impl& m = *impl_;
  if (!m.cfg.page_codes) return {};
  return {m.pcodes.data(),     m.cfg.capacity_pages, m.cfg.num_kv_heads,
          m.cfg.page_size,     m.cfg.head_dim,       m.prange_min.data(),
          m.prange_max.data(), m.prange_grid.data(), m.ccodes.data(),
          m.cranges.data(),    m.cspread.data()};
}

SelectorKeysView PagedKVCache::selector_keys() const {
  const Impl& m = *impl_;
  if (!m.cfg.has_selector_keys()) return {};
  return {m.cfg.selector_key_format,
          m.sk.data(),
          m.sk_scale_bytes > 0 ? m.sk_scales.data() : nullptr,
          m.cfg.capacity_pages,
          m.cfg.num_kv_heads,
          m.cfg.page_size,
          m.cfg.head_dim};
}

KeyRowsView PagedKVCache::key_rows() const { return impl_->key_rows_view(); }

double PagedKVCache::key_row_bytes_per_token() const {
  const CacheConfig& c = impl_->cfg;
  return c.key_row_groups * static_cast<double>(row_bytes(c.key_row_format, c.key_row_dim));
}

double PagedKVCache::selector_key_bytes_per_token() const {
  const CacheConfig& c = impl_->cfg;
  return c.has_selector_keys()
             ? static_cast<double>(c.num_kv_heads) * row_bytes(c.selector_key_format, c.head_dim)
             : 0.0;
}

double PagedKVCache::kv_bytes_per_token() const {
  const CacheConfig& c = impl_->cfg;
  return 2.0 * c.num_kv_heads * c.head_dim * static_cast<double>(dtype_size(c.dtype));
}

double PagedKVCache::summary_bytes_per_token() const {
  // Per page: min, max, mean, M2 (f32, [head][d]), max ||v|| (f32, [head]), count (int32).
  const CacheConfig& c = impl_->cfg;
  const double per_page = c.num_kv_heads * (4.0 * c.head_dim * 4 + 4) + 4;
  return per_page / c.page_size;
}

PageSummary recompute_summary(const PagedKVView& view, std::int32_t page, int head, int count) {
  using enum ErrorCode;
  require(page >= 0 && page < view.num_pages, out_of_range, "page", page,
          " is outside [0, num_pages = ", view.num_pages, ")");
  require(head >= 0 && head < view.num_kv_heads, out_of_range, "head", head,
          " is outside [0, num_kv_heads = ", view.num_kv_heads, ")");
  require(count >= 0 && count <= view.page_size, out_of_range, "count", count,
          " is outside [0, page_size = ", view.page_size, "]");
  const int d = view.head_dim;
  PageSummary s;
  s.min.assign(d, std::numeric_limits<float>::infinity());
  s.max.assign(d, -std::numeric_limits<float>::infinity());
  s.mean.assign(d, 0.0);
  s.m2.assign(d, 0.0);
  s.count = count;
  visit_dtype(view.dtype, [&](auto tag) {
    using T = decltype(tag);
    // Two passes (mean, then squared deviations): a different algorithm from the cache's
    // Welford update, so agreement is evidence, not tautology.
    for (int slot = 0; slot < count; ++slot) {
      const T* key = view.key<T>(page, head, slot);
      const T* val = view.value<T>(page, head, slot);
      double vn = 0;
      for (int c = 0; c < d; ++c) {
        const float x = to_f32(key[c]);
        s.min[c] = min_rule(x, s.min[c]);
        s.max[c] = max_rule(x, s.max[c]);
        s.mean[c] += x;
        const double y = to_f32(val[c]);
        vn += y * y;
      }
      s.max_vnorm = std::max(s.max_vnorm, std::sqrt(vn));
    }
    if (count == 0) return;
    for (int c = 0; c < d; ++c) s.mean[c] /= count;
    for (int slot = 0; slot < count; ++slot) {
      const T* key = view.key<T>(page, head, slot);
      for (int c = 0; c < d; ++c) {
        const double e = to_f32(key[c]) - s.mean[c];
        s.m2[c] += e * e;
      }
    }
  });
  return s;
}

}  // namespace masskv::kv
