// PagedKVCache (append / fork / free / page table / summaries / pool views) and the KV view.
#include <cstdint>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "kv_objects.hpp"
#include "masskv/error.hpp"
#include "masskv/select/page_bound.hpp"

namespace masskv::py {

kv::PagedKVView KV::checked() const {
  if (cache != nullptr && cache->generation != generation) {
    throw nb::value_error(
        "kv: stale view: the cache was appended to, forked or freed after view() was taken; "
        "call cache.view(seqs) again");
  }
  kv::PagedKVView out = view;
  if (cache != nullptr) out.table = table.table();
  return out;
}

const Cache& KV::require_cache(const char* what) const {
  if (cache == nullptr) {
    throw nb::value_error((std::string("kv: ") + what +
                           " needs the page summaries of a masskv.PagedKVCache; this view was "
                           "built from arrays (KV.from_arrays)")
                              .c_str());
  }
  checked();
  return *cache;
}

kv::Layout parse_layout(const std::string& s) {
  if (s == "HND") return kv::Layout::HND;
  if (s == "NHD") return kv::Layout::NHD;
  fail(ErrorCode::invalid_argument, "layout", "expected \"HND\" or \"NHD\", got \"", s, "\"");
}

namespace {

// Pool shape in the cache's layout: HND [page][head][slot][d], NHD [page][slot][head][d].
std::vector<std::size_t> pool_shape(const kv::CacheConfig& c) {
  const auto pages = static_cast<std::size_t>(c.capacity_pages);
  const auto H = static_cast<std::size_t>(c.num_kv_heads);
  const auto P = static_cast<std::size_t>(c.page_size);
  const auto d = static_cast<std::size_t>(c.head_dim);
  return c.layout == kv::Layout::HND ? std::vector<std::size_t>{pages, H, P, d}
                                     : std::vector<std::size_t>{pages, P, H, d};
}

// NumPy has no bfloat16: a bf16 pool is viewed as its uint16 bit patterns.
nb::dlpack::dtype numpy_storage_dtype(DType t) {
  if (t == DType::bf16) return nb::dtype<std::uint16_t>();
  return storage_dtype(t);
}

void append(Cache& c, kv::SeqId seq, InArray k, InArray v) {
  const kv::CacheConfig& cfg = c.cache.config();
  for (auto [a, name] : {std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    require_flat(*a, Elem::f32, name);
    if (a->ndim() != 3 || a->shape(1) != static_cast<std::size_t>(cfg.num_kv_heads) ||
        a->shape(2) != static_cast<std::size_t>(cfg.head_dim)) {
      throw nb::value_error((std::string(name) + ": expected shape (n, " +
                             std::to_string(cfg.num_kv_heads) + ", " +
                             std::to_string(cfg.head_dim) + "), got " + shape_string(*a))
                                .c_str());
    }
  }
  if (k.shape(0) != v.shape(0)) throw nb::value_error("v: token count differs from k's");
  const int n = dim_int(k, 0, "k");
  const std::span<const float> ks(static_cast<const float*>(k.data()), k.size());
  const std::span<const float> vs(static_cast<const float*>(v.data()), v.size());
  {
    nb::gil_scoped_release nogil;
    c.cache.append(seq, ks, vs, n);
  }
  ++c.generation;
}

std::vector<kv::SeqId> seq_list(nb::handle seqs) {
  if (nb::isinstance<nb::int_>(seqs)) return {nb::cast<kv::SeqId>(seqs)};
  return nb::cast<std::vector<kv::SeqId>>(seqs);
}

KV view_of(const Cache& c, nb::handle seqs) {
  KV kvv;
  const std::vector<kv::SeqId> ids = seq_list(seqs);
  kvv.table = c.cache.page_table(ids);
  kvv.view = c.cache.view(kvv.table);
  kvv.cache = &c;
  kvv.generation = c.generation;
  return kvv;
}

// KV view over caller arrays: k, v [pages][H][P][d] (HND) or [pages][P][H][d] (NHD), equal
// strides, contiguous last axis; int32 page table.
KV kv_from_arrays(InArray k, InArray v, InArray indptr, InArray indices, InArray last_page_len,
                  const std::string& layout, std::optional<std::string> dtype) {
  const kv::Layout lay = parse_layout(layout);
  DType dt = DType::f32;
  const Device device = device_of(k, "k");
  require_device(v, device, "v");
  if (dtype) {
    dt = parse_dtype(*dtype, "dtype");
    // bf16 bits may come as uint16 (NumPy has no bfloat16).
    const bool bits_ok = dt == DType::bf16 && k.dtype() == nb::dtype<std::uint16_t>();
    if (!bits_ok)
      require_dtype(k,
                    dt == DType::f32   ? Elem::f32
                    : dt == DType::f16 ? Elem::f16
                                       : Elem::bf16,
                    "k");
  } else if (k.dtype() == dlpack_dtype(Elem::f16)) {
    dt = DType::f16;
  } else if (k.dtype() == dlpack_dtype(Elem::bf16)) {
    dt = DType::bf16;
  } else {
    require_dtype(k, Elem::f32, "k");
  }
  if (v.dtype() != k.dtype()) {
    throw nb::type_error(
        ("v: dtype " + dtype_name(v.dtype()) + " differs from k's " + dtype_name(k.dtype()))
            .c_str());
  }
  require_ndim(k, 4, "k");
  require_ndim(v, 4, "v");
  for (std::size_t i = 0; i < 4; ++i) {
    if (k.shape(i) != v.shape(i) || (k.shape(i) > 1 && k.stride(i) != v.stride(i))) {
      throw nb::value_error(("v: shape " + shape_string(v) + " / strides differ from k's " +
                             shape_string(k) + " (K and V share one set of strides)")
                                .c_str());
    }
  }
  if (k.shape(3) > 1 && k.stride(3) != 1) {
    throw nb::value_error("k: the head_dim axis (last) must be contiguous");
  }
  KV kvv;
  kv::PagedKVView& w = kvv.view;
  w.k = k.data();
  w.v = v.data();
  w.dtype = dt;
  w.num_pages = dim_int(k, 0, "k");
  const std::size_t head_axis = lay == kv::Layout::HND ? 1 : 2;
  const std::size_t slot_axis = lay == kv::Layout::HND ? 2 : 1;
  w.num_kv_heads = dim_int(k, head_axis, "k");
  w.page_size = dim_int(k, slot_axis, "k");
  w.head_dim = dim_int(k, 3, "k");
  w.stride_page = k.stride(0);
  w.stride_head = k.stride(head_axis);
  w.stride_slot = k.stride(slot_axis);
  for (std::int64_t s : {w.stride_page, w.stride_head, w.stride_slot}) {
    if (s < 0) throw nb::value_error("k: negative strides are not supported");
  }
  w.table.indptr = flat_span<std::int32_t>(indptr, Elem::i32, "indptr", device);
  w.table.indices = flat_span<std::int32_t>(indices, Elem::i32, "indices", device);
  w.table.last_page_len =
      flat_span<std::int32_t>(last_page_len, Elem::i32, "last_page_len", device);
  if (device == kCpu) {
    w.validate();
  } else {
    // The host cannot read a device page table: check its shape here; the CUDA kernels check
    // every id they use and raise instead of reading a bad page.
    w.validate_geometry();
    if (w.table.indptr.empty() || w.table.last_page_len.size() + 1 != w.table.indptr.size()) {
      throw nb::value_error(("last_page_len: " + std::to_string(w.table.last_page_len.size()) +
                             " entries for indptr of " + std::to_string(w.table.indptr.size()) +
                             " (expected indptr = B + 1, last_page_len = B)")
                                .c_str());
    }
  }
  kvv.device = device;
  kvv.k = k;
  kvv.v = v;
  kvv.indptr = indptr;
  kvv.indices = indices;
  kvv.last_page_len = last_page_len;
  return kvv;
}

}  // namespace

void bind_cache(nb::module_& m) {
  nb::class_<Cache>(
      m, "PagedKVCache",
      "One layer's paged KV cache (docs/design.md §3): a fixed pool of pages, per-page key\n"
      "summaries, and per-sequence page lists. Not thread-safe: serialise mutation.\n"
      "k_pool / v_pool / summaries() are zero-copy read-only views of the C++ memory; the pool\n"
      "never moves, so their data pointers are stable for the cache's lifetime.")
      .def(
          "__init__",
          [](Cache* self, int num_kv_heads, int head_dim, int capacity_pages, int page_size,
             const std::string& dtype, const std::string& layout, bool page_codes) {
            kv::CacheConfig c;
            c.page_codes = page_codes;
            c.num_kv_heads = num_kv_heads;
            c.head_dim = head_dim;
            c.capacity_pages = capacity_pages;
            c.page_size = page_size;
            c.dtype = parse_dtype(dtype, "dtype");
            c.layout = parse_layout(layout);
            new (self) Cache(c);
          },
          nb::arg("num_kv_heads"), nb::arg("head_dim"), nb::arg("capacity_pages"),
          nb::arg("page_size") = 16, nb::arg("dtype") = "f16", nb::arg("layout") = "HND",
          nb::arg("page_codes") = false,
          "dtype: storage of K and V, \"f32\" | \"f16\" | \"bf16\"; layout: \"HND\" "
          "([page][head][slot][d]) or \"NHD\" ([page][slot][head][d]); page_codes: keep "
          "2-bit codes of every key (for select(method=\"token_codes\" or \"two_stage\")).")
      .def(
          "create",
          [](Cache& c) {
            ++c.generation;
            return c.cache.create();
          },
          "A new empty sequence; returns its id.")
      .def(
          "fork",
          [](Cache& c, kv::SeqId parent) {
            const kv::SeqId s = c.cache.fork(parent);
            ++c.generation;
            return s;
          },
          nb::arg("parent"),
          "A new sequence sharing all of `parent`'s pages (copy on write of the partial last "
          "page).")
      .def(
          "free",
          [](Cache& c, kv::SeqId seq) {
            c.cache.free(seq);
            ++c.generation;
          },
          nb::arg("seq"), "Releases the sequence; unshared pages return to the free list.")
      .def("append", &append, nb::arg("seq"), nb::arg("k").noconvert(), nb::arg("v").noconvert(),
           "Appends n tokens: k, v float32 C-contiguous of shape (n, num_kv_heads, head_dim),\n"
           "converted to the cache dtype (round to nearest even). Nothing is appended on error\n"
           "(pool exhausted, non-finite input).")
      .def(
          "length", [](const Cache& c, kv::SeqId s) { return c.cache.length(s); }, nb::arg("seq"))
      .def(
          "alive", [](const Cache& c, kv::SeqId s) { return c.cache.alive(s); }, nb::arg("seq"))
      .def_prop_ro("free_pages", [](const Cache& c) { return c.cache.free_pages(); })
      .def_prop_ro("num_kv_heads", [](const Cache& c) { return c.cache.config().num_kv_heads; })
      .def_prop_ro("head_dim", [](const Cache& c) { return c.cache.config().head_dim; })
      .def_prop_ro("page_size", [](const Cache& c) { return c.cache.config().page_size; })
      .def_prop_ro("capacity_pages", [](const Cache& c) { return c.cache.config().capacity_pages; })
      .def_prop_ro("dtype",
                   [](const Cache& c) { return std::string(to_string(c.cache.config().dtype)); })
      .def_prop_ro("layout",
                   [](const Cache& c) {
                     return std::string(c.cache.config().layout == kv::Layout::HND ? "HND" : "NHD");
                   })
      .def_prop_ro("kv_bytes_per_token",
                   [](const Cache& c) { return c.cache.kv_bytes_per_token(); })
      .def_prop_ro("summary_bytes_per_token",
                   [](const Cache& c) { return c.cache.summary_bytes_per_token(); })
      .def_prop_ro(
          "k_pool",
          [](nb::handle self) {
            const Cache& c = nb::cast<const Cache&>(self);
            kv::PageTableStorage none;
            return numpy_view(c.cache.view(none).k, pool_shape(c.cache.config()),
                              numpy_storage_dtype(c.cache.config().dtype), self);
          },
          "Read-only zero-copy view of the K pool, (pages, H, P, d) for HND or (pages, P, H, d)\n"
          "for NHD; float32 / float16, or uint16 bit patterns for bf16.")
      .def_prop_ro(
          "v_pool",
          [](nb::handle self) {
            const Cache& c = nb::cast<const Cache&>(self);
            kv::PageTableStorage none;
            return numpy_view(c.cache.view(none).v, pool_shape(c.cache.config()),
                              numpy_storage_dtype(c.cache.config().dtype), self);
          },
          "Read-only zero-copy view of the V pool (same shape and dtype as k_pool).")
      .def(
          "summaries",
          [](nb::handle self) {
            const kv::SummariesView s = nb::cast<const Cache&>(self).cache.summaries();
            const auto pages = static_cast<std::size_t>(s.num_pages);
            const auto H = static_cast<std::size_t>(s.num_kv_heads);
            const auto d = static_cast<std::size_t>(s.head_dim);
            const nb::dlpack::dtype f = nb::dtype<float>();
            nb::dict out;
            out["min"] = numpy_view(s.min, {pages, H, d}, f, self);
            out["max"] = numpy_view(s.max, {pages, H, d}, f, self);
            out["mean"] = numpy_view(s.mean, {pages, H, d}, f, self);
            out["m2"] = numpy_view(s.m2, {pages, H, d}, f, self);
            out["count"] = numpy_view(s.count, {pages}, nb::dtype<std::int32_t>(), self);
            out["max_vnorm"] = numpy_view(s.max_vnorm, {pages, H}, f, self);
            return out;
          },
          "Per physical page and kv head key statistics as read-only zero-copy views (live:\n"
          "they follow later appends): min, max, mean, m2 (pages, H, d) float32, count (pages,)\n"
          "int32, max_vnorm (pages, H) float32.")
      .def(
          "bf16_bounds",
          [](const Cache& c) {
            const select::BoundStore store(c.cache.summaries());
            const select::BoundStoreView b = store.view();
            const std::vector<std::size_t> shape{static_cast<std::size_t>(b.num_pages),
                                                 static_cast<std::size_t>(b.num_kv_heads),
                                                 static_cast<std::size_t>(b.head_dim)};
            const std::size_t n = shape[0] * shape[1] * shape[2];
            std::uint16_t* lo = nullptr;
            std::uint16_t* hi = nullptr;
            nb::object mn = new_numpy<std::uint16_t>(shape, &lo);
            nb::object mx = new_numpy<std::uint16_t>(shape, &hi);
            for (std::size_t i = 0; i < n; ++i) {
              lo[i] = b.min[i].bits;
              hi[i] = b.max[i].bits;
            }
            return nb::make_tuple(mn, mx);
          },
          "The page bounds' bf16 store (docs/design.md §2.3: min/max rounded outward, so the\n"
          "Quest bound stays an upper bound): (min, max) as uint16 bit arrays (pages, H, d), a\n"
          "copy. For cuda_quest_select: torch.from_numpy(a).view(torch.bfloat16).cuda().")
      .def(
          "page_table",
          [](const Cache& c, nb::handle seqs) {
            kv::PageTableStorage t = c.cache.page_table(seq_list(seqs));
            nb::dict out;
            const std::size_t b = t.last_page_len.size();
            out["indptr"] = numpy_from_vector(std::move(t.indptr), {b + 1});
            const std::size_t nnz = t.indices.size();
            out["indices"] = numpy_from_vector(std::move(t.indices), {nnz});
            out["last_page_len"] = numpy_from_vector(std::move(t.last_page_len), {b});
            return out;
          },
          nb::arg("seqs"),
          "FlashInfer-style CSR page table of the given sequences (an int or a list of ints):\n"
          "dict of int32 arrays indptr (B+1,), indices (nnz,), last_page_len (B,).")
      .def("view", &view_of, nb::arg("seqs"), nb::keep_alive<0, 1>(),
           "KV view of the given sequences (an int or a list of ints), in order, for the\n"
           "kernels and selectors. A snapshot: using it after the cache changed raises.");

  nb::class_<KV>(m, "KV",
                 "A paged KV view for kernels: a page table over a K/V pool. From\n"
                 "PagedKVCache.view(seqs), or KV.from_arrays over an engine's own pool.")
      .def_static("from_arrays", &kv_from_arrays, nb::arg("k").noconvert(),
                  nb::arg("v").noconvert(), nb::arg("indptr").noconvert(),
                  nb::arg("indices").noconvert(), nb::arg("last_page_len").noconvert(),
                  nb::arg("layout") = "HND", nb::arg("dtype").none() = nb::none(),
                  "Zero-copy view over caller arrays: k, v of shape (pages, H, P, d) (HND) or\n"
                  "(pages, P, H, d) (NHD), float32 / float16 / bfloat16 (or uint16 bits with\n"
                  "dtype=\"bf16\"), any non-negative strides shared by k and v with a contiguous\n"
                  "last axis; int32 C-contiguous page table. The arrays are held, not copied.\n"
                  "CUDA build: all five may be CUDA tensors of one device (f16 / bf16 pool);\n"
                  "the table is then checked by the kernels, which cannot be read here.")
      .def_prop_ro("batch", [](const KV& k) { return k.view.table.batch(); })
      .def_prop_ro("num_kv_heads", [](const KV& k) { return k.view.num_kv_heads; })
      .def_prop_ro("head_dim", [](const KV& k) { return k.view.head_dim; })
      .def_prop_ro("page_size", [](const KV& k) { return k.view.page_size; })
      .def_prop_ro("dtype", [](const KV& k) { return std::string(to_string(k.view.dtype)); })
      .def_prop_ro("has_summaries", [](const KV& k) { return k.cache != nullptr; })
      .def_prop_ro(
          "device", [](const KV& k) { return device_string(k.device); },
          "Where the pool and page table live: \"the CPU\" or \"cuda:N\".")
      .def(
          "lengths",
          [](const KV& k) {
            if (k.device != kCpu) {
              throw nb::value_error(
                  ("lengths: the page table is on " + device_string(k.device) +
                   "; the host cannot read it")
                      .c_str());
            }
            std::vector<std::int64_t> out;
            for (int b = 0; b < k.view.table.batch(); ++b)
              out.push_back(k.view.table.length(b, k.view.page_size));
            return out;
          },
          "Tokens per sequence of the view.");
}

}  // namespace masskv::py
