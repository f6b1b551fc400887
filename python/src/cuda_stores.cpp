// masskv.cuda_append / cuda_summarize_pages / cuda_check (CUDA builds only): the GPU append of
// a decode step and the summary refresh of pages written elsewhere, over torch tensors that the
// caller owns (masskv.torch_cache.TorchPagedCache, or an engine's own pool), and the deferred
// error check of calls made with check=False (CUDA graphs: the flag is read after the replay).
#include "bindings.hpp"

#if MASSKV_PY_CUDA

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "cuda_calls.hpp"
#include "cuda_device.hpp"
#include "masskv/cuda/append.hpp"
#include "masskv/cuda/decode.hpp"
#include "masskv/cuda/prefill.hpp"
#include "masskv/cuda/select.hpp"
#include "masskv/cuda/two_stage.hpp"
#include "kv_objects.hpp"
#include "masskv/error.hpp"

namespace masskv::py {

void check_device_errors(Device device, CUstream_st* stream) {
  // Each kind's own messages (decode: "indices" / "selection" / ...; select; append).
  on_device<cuda::AppendWorkspace>(device, stream, [&](auto& w) { w.check(stream); });
  on_device<cuda::SelectWorkspace>(device, stream, [&](auto& w) { w.check(stream); });
  on_device<cuda::DecodeWorkspace>(device, stream, [&](auto& w) { w.check(stream); });
  on_device<cuda::PrefillWorkspace>(device, stream, [&](auto& w) { w.check(stream); });
  on_device<cuda::TwoStageWorkspace>(device, stream, [&](auto& w) { w.check(stream); });
}

namespace {

// The keys a stores dict may hold; anything else is a typo and fails (never ignored).
constexpr std::array kStoreKeys{"k_pool", "v_pool",    "layout",    "min",       "max",
                                "mean",   "m2",        "count",     "max_vnorm", "bound_min",
                                "bound_max", "bound_wmax"};

InArray store_array(const nb::dict& d, const char* key) {
  if (!d.contains(key)) {
    throw nb::value_error(
        (std::string("stores: missing '") + key +
         "' (keys: k_pool, v_pool, min, max, mean, m2, count, max_vnorm; optional layout, "
         "bound_min, bound_max, bound_wmax)")
            .c_str());
  }
  return as_array(d[key], key);
}

// A C-contiguous array of dtype e on `device` with exactly `shape`.
template <std::size_t N>
void require_store(const InArray& a, Elem e, const char* name, Device device,
                   const std::array<std::size_t, N>& shape) {
  require_flat(a, e, name, device);
  bool ok = a.ndim() == N;
  for (std::size_t i = 0; ok && i < N; ++i) ok = a.shape(i) == shape[i];
  if (!ok) {
    std::string want = "(";
    for (std::size_t i = 0; i < N; ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
    throw nb::value_error((std::string(name) + ": expected " + elem_name(e) + " " + want +
                           "), got " + shape_string(a))
                              .c_str());
  }
}

template <class T>
T* mutable_data(const InArray& a) {
  return static_cast<T*>(const_cast<void*>(a.data()));
}

// ValueError "<what>: unknown key 'k'" for a key of d outside `keys` (a misspelt store).
void require_known_keys(const nb::dict& d, std::span<const char* const> keys, const char* what) {
  for (auto [key, value] : d) {
    const std::string k = nb::cast<std::string>(key);
    bool known = false;
    for (const char* s : keys) known = known || k == s;
    if (!known) throw nb::value_error((std::string(what) + ": unknown key '" + k + "'").c_str());
  }
}

// The pool and the summary stores of a dict of tensors, all on one CUDA device (returned).
cuda::SummaryStores stores_of(const nb::dict& d, Device& device) {
  require_known_keys(d, kStoreKeys, "stores");
  const kv::Layout layout =
      parse_layout(d.contains("layout") ? nb::cast<std::string>(d["layout"]) : "NHD");
  const InArray k = store_array(d, "k_pool"), v = store_array(d, "v_pool");
  device = device_of(k, "k_pool");
  if (device == kCpu) {
    throw nb::value_error("k_pool: on the CPU; the CUDA append runs on CUDA tensors "
                          "(PagedKVCache.append is the CPU one)");
  }
  require_device(v, device, "v_pool");
  cuda::SummaryStores s;
  if (k.dtype() == dlpack_dtype(Elem::bf16)) {
    s.dtype = DType::bf16;
  } else if (k.dtype() == dlpack_dtype(Elem::f16)) {
    s.dtype = DType::f16;
  } else {
    throw nb::type_error(
        ("k_pool: expected bfloat16 or float16, got " + dtype_name(k.dtype())).c_str());
  }
  require_ndim(k, 4, "k_pool");
  for (std::size_t i = 0; i < 4; ++i) {
    if (v.dtype() != k.dtype() || v.ndim() != 4 || v.shape(i) != k.shape(i) ||
        v.stride(i) != k.stride(i)) {
      throw nb::value_error(("v_pool: dtype / shape " + shape_string(v) +
                             " / strides differ from k_pool's " + shape_string(k))
                                .c_str());
    }
  }
  if (k.stride(3) != 1) throw nb::value_error("k_pool: the head_dim axis (last) must be contiguous");
  const bool nhd = layout == kv::Layout::NHD;  // [page][slot][head][d], else [page][head][slot][d]
  s.k_pool = mutable_data<void>(k);
  s.v_pool = mutable_data<void>(v);
  s.num_pages = dim_int(k, 0, "k_pool");
  s.page_size = dim_int(k, nhd ? 1 : 2, "k_pool");
  s.num_kv_heads = dim_int(k, nhd ? 2 : 1, "k_pool");
  s.head_dim = dim_int(k, 3, "k_pool");
  s.stride_page = k.stride(0);
  s.stride_slot = k.stride(nhd ? 1 : 2);
  s.stride_head = k.stride(nhd ? 2 : 1);
  const auto P = static_cast<std::size_t>(s.num_pages), H = static_cast<std::size_t>(s.num_kv_heads),
             D = static_cast<std::size_t>(s.head_dim);
  const std::array<std::size_t, 3> phd{P, H, D};
  const std::array<std::size_t, 2> ph{P, H};
  float** f3[] = {&s.min, &s.max, &s.mean, &s.m2};
  const char* f3_names[] = {"min", "max", "mean", "m2"};
  for (int i = 0; i < 4; ++i) {
    const InArray a = store_array(d, f3_names[i]);
    require_store(a, Elem::f32, f3_names[i], device, phd);
    *f3[i] = mutable_data<float>(a);
  }
  const InArray count = store_array(d, "count");
  require_store(count, Elem::i32, "count", device, std::array<std::size_t, 1>{P});
  s.count = mutable_data<std::int32_t>(count);
  const InArray vnorm = store_array(d, "max_vnorm");
  require_store(vnorm, Elem::f32, "max_vnorm", device, ph);
  s.max_vnorm = mutable_data<float>(vnorm);
  const bool any_bound = d.contains("bound_min") || d.contains("bound_max") ||
                         d.contains("bound_wmax");
  if (any_bound) {
    const InArray lo = store_array(d, "bound_min"), hi = store_array(d, "bound_max"),
                  w = store_array(d, "bound_wmax");
    require_store(lo, Elem::bf16, "bound_min", device, phd);
    require_store(hi, Elem::bf16, "bound_max", device, phd);
    require_store(w, Elem::f32, "bound_wmax", device, ph);
    s.bound_min = mutable_data<bf16>(lo);
    s.bound_max = mutable_data<bf16>(hi);
    s.bound_wmax = mutable_data<float>(w);
  }
  return s;
}

std::span<const std::int32_t> ids_of(const InArray& a, const char* name, Device device,
                                     std::size_t n) {
  const std::span<const std::int32_t> s = flat_span<std::int32_t>(a, Elem::i32, name, device);
  if (s.size() != n) {
    throw nb::value_error((std::string(name) + ": expected " + std::to_string(n) +
                           " int32 entries, got " + std::to_string(s.size()))
                              .c_str());
  }
  return s;
}

// cuda_append's groups= dict: the group store and the step's page and group tables
// (cuda::GroupRefresh).
cuda::GroupRefresh groups_of(const nb::dict& d, const cuda::SummaryStores& st, Device device,
                             std::size_t batch) {
  static constexpr std::array keys{"group_min", "group_max", "indptr", "indices",
                                   "group_indptr", "group_indices", "group_pages"};
  require_known_keys(d, keys, "groups");
  for (const char* k : {"group_min", "group_max", "indptr", "indices", "group_indptr",
                        "group_indices"}) {
    if (!d.contains(k)) throw nb::value_error((std::string("groups: missing '") + k + "'").c_str());
  }
  if (st.bound_min == nullptr)
    throw nb::value_error("groups: the group refresh reads the bound store (bound_min, ...)");
  cuda::GroupRefresh g;
  const InArray lo = nb::cast<InArray>(d["group_min"]), hi = nb::cast<InArray>(d["group_max"]);
  require_flat(lo, Elem::bf16, "group_min", device);
  require_ndim(lo, 3, "group_min");
  const std::array<std::size_t, 3> shape{lo.shape(0), static_cast<std::size_t>(st.num_kv_heads),
                                         static_cast<std::size_t>(st.head_dim)};
  require_store(lo, Elem::bf16, "group_min", device, shape);
  require_store(hi, Elem::bf16, "group_max", device, shape);
  g.min = mutable_data<bf16>(lo);
  g.max = mutable_data<bf16>(hi);
  g.slots = static_cast<int>(shape[0]);
  g.group_pages = d.contains("group_pages") ? nb::cast<int>(d["group_pages"]) : 16;
  g.indptr = ids_of(nb::cast<InArray>(d["indptr"]), "indptr", device, batch + 1);
  g.indices = flat_span<std::int32_t>(nb::cast<InArray>(d["indices"]), Elem::i32, "indices",
                                      device);
  g.group_indptr = ids_of(nb::cast<InArray>(d["group_indptr"]), "group_indptr", device, batch + 1);
  g.group_indices = flat_span<std::int32_t>(nb::cast<InArray>(d["group_indices"]), Elem::i32,
                                            "group_indices", device);
  return g;
}

void append_py(const nb::dict& stores, const InArray& k, const InArray& v, const InArray& page,
               const InArray& slot, nb::handle stream, bool check, nb::handle groups) {
  Device device = kCpu;
  cuda::AppendArgs a;
  static_cast<cuda::SummaryStores&>(a) = stores_of(stores, device);
  a.k = view3_f32(k, "k", device);
  a.v = view3_f32(v, "v", device);
  const auto B = static_cast<std::size_t>(a.k.n0);
  a.page = ids_of(page, "page", device, B);
  a.slot = ids_of(slot, "slot", device, B);
  if (!groups.is_none()) {
    if (!nb::isinstance<nb::dict>(groups)) throw nb::type_error("groups: expected a dict or None");
    a.groups = groups_of(nb::borrow<nb::dict>(groups), a, device, B);
  }
  CUstream_st* s = resolve_stream(stream, device);
  on_device<cuda::AppendWorkspace>(device, s,
                                   [&](auto& w) { cuda::append(a, w, s, check); });
}

void summarize_py(const nb::dict& stores, const InArray& pages, const InArray& tokens,
                  nb::handle stream, bool check) {
  Device device = kCpu;
  const cuda::SummaryStores st = stores_of(stores, device);
  const std::span<const std::int32_t> p =
      flat_span<std::int32_t>(pages, Elem::i32, "pages", device);
  const std::span<const std::int32_t> t = ids_of(tokens, "tokens", device, p.size());
  CUstream_st* s = resolve_stream(stream, device);
  on_device<cuda::AppendWorkspace>(
      device, s, [&](auto& w) { cuda::summarize_pages(st, p, t, w, s, check); });
}

// The page-code stores of a dict of CUDA tensors on `device` for the pool `st` describes
// (kv::PageCodesView's layout, each C-contiguous): codes uint8 (pages, H_kv, page_size,
// ceil(d / 4)), range_min / range_max uint8 (pages, H_kv, d), grid float32 (pages, H_kv, 2),
// chan_codes uint8 (H_kv, d, pages, ceil(page_size / 4)), chan_ranges uint8 (H_kv, d, pages, 2),
// chan_spread float32 (pages, H_kv, d).
struct CodesArrays {
  cuda::PageCodesStores out;
  float* spread = nullptr;
  kv::PageCodesView view() const {
    kv::PageCodesView v;
    v.codes = out.codes;
    v.range_min = out.range_min;
    v.range_max = out.range_max;
    v.grid = out.grid;
    v.chan_codes = out.chan_codes;
    v.chan_ranges = out.chan_ranges;
    v.chan_spread = spread;
    return v;
  }
};

constexpr std::array kCodeKeys{"codes", "range_min", "range_max", "grid", "chan_codes",
                               "chan_ranges", "chan_spread"};

CodesArrays codes_of(const nb::dict& d, int num_pages, int heads, int page_size, int dim,
                     Device device) {
  require_known_keys(d, kCodeKeys, "codes");
  const auto get = [&](const char* key) {
    if (!d.contains(key)) {
      throw nb::value_error((std::string("codes: missing '") + key +
                             "' (keys: codes, range_min, range_max, grid, chan_codes, "
                             "chan_ranges, chan_spread)")
                                .c_str());
    }
    return as_array(d[key], key);
  };
  const auto N = static_cast<std::size_t>(num_pages), H = static_cast<std::size_t>(heads),
             P = static_cast<std::size_t>(page_size), D = static_cast<std::size_t>(dim);
  const std::size_t cb = (D + 3) / 4, wb = (P + 3) / 4;
  CodesArrays c;
  const InArray codes = get("codes"), lo = get("range_min"), hi = get("range_max"),
                grid = get("grid"), cc = get("chan_codes"), cr = get("chan_ranges"),
                sp = get("chan_spread");
  require_store(codes, Elem::u8, "codes", device, std::array<std::size_t, 4>{N, H, P, cb});
  require_store(lo, Elem::u8, "range_min", device, std::array<std::size_t, 3>{N, H, D});
  require_store(hi, Elem::u8, "range_max", device, std::array<std::size_t, 3>{N, H, D});
  require_store(grid, Elem::f32, "grid", device, std::array<std::size_t, 3>{N, H, 2});
  require_store(cc, Elem::u8, "chan_codes", device, std::array<std::size_t, 4>{H, D, N, wb});
  require_store(cr, Elem::u8, "chan_ranges", device, std::array<std::size_t, 4>{H, D, N, 2});
  require_store(sp, Elem::f32, "chan_spread", device, std::array<std::size_t, 3>{N, H, D});
  c.out = {mutable_data<std::uint8_t>(codes), mutable_data<std::uint8_t>(lo),
           mutable_data<std::uint8_t>(hi),    mutable_data<float>(grid),
           mutable_data<std::uint8_t>(cc),    mutable_data<std::uint8_t>(cr)};
  c.spread = mutable_data<float>(sp);
  return c;
}

void encode_codes_py(const nb::dict& stores, const nb::dict& codes, const InArray& pages,
                     const InArray& tokens, nb::handle stream, bool check) {
  Device device = kCpu;
  const cuda::SummaryStores st = stores_of(stores, device);
  const CodesArrays c =
      codes_of(codes, st.num_pages, st.num_kv_heads, st.page_size, st.head_dim, device);
  const std::span<const std::int32_t> p =
      flat_span<std::int32_t>(pages, Elem::i32, "pages", device);
  const std::span<const std::int32_t> t = ids_of(tokens, "tokens", device, p.size());
  CUstream_st* s = resolve_stream(stream, device);
  on_device<cuda::AppendWorkspace>(
      device, s, [&](auto& w) { cuda::encode_page_codes(st, c.out, p, t, w, s, check); });
}

void update_spread_py(const nb::dict& stores, const nb::dict& codes, const InArray& indptr,
                      const InArray& indices, const InArray& last_page_len, int tokens,
                      const InArray& mean, const InArray& m2, nb::handle stream, bool check,
                      const std::optional<InArray>& counts) {
  Device device = kCpu;
  const cuda::SummaryStores st = stores_of(stores, device);
  const CodesArrays c =
      codes_of(codes, st.num_pages, st.num_kv_heads, st.page_size, st.head_dim, device);
  const std::span<const std::int32_t> ptr =
      flat_span<std::int32_t>(indptr, Elem::i32, "indptr", device);
  if (ptr.empty()) throw nb::value_error("indptr: needs B + 1 >= 1 entries");
  const std::size_t B = ptr.size() - 1;
  const std::span<const std::int32_t> idx =
      flat_span<std::int32_t>(indices, Elem::i32, "indices", device);
  const std::span<const std::int32_t> last = ids_of(last_page_len, "last_page_len", device, B);
  const std::array<std::size_t, 3> bhd{B, static_cast<std::size_t>(st.num_kv_heads),
                                       static_cast<std::size_t>(st.head_dim)};
  require_store(mean, Elem::f64, "mean", device, bhd);
  require_store(m2, Elem::f64, "m2", device, bhd);
  const std::span<const std::int32_t> per_row =
      counts ? ids_of(*counts, "counts", device, B) : std::span<const std::int32_t>{};
  CUstream_st* s = resolve_stream(stream, device);
  on_device<cuda::AppendWorkspace>(device, s, [&](auto& w) {
    cuda::update_spread(st, ptr, idx, last, tokens, mutable_data<double>(mean),
                        mutable_data<double>(m2), c.spread, w, s, check, per_row);
  });
}

// token_codes' selection on the GPU (cuda::two_stage_select with no page stage): every token of
// kv's sequences ranked on the page codes, two passes, the q heads pooled by log-probability —
// the CPU's token_codes lists. Returns a token Selection over torch int32 ids / count.
nb::object token_codes_select_py(const InArray& q, const KV& kv, const nb::dict& codes,
                                 std::int64_t budget_tokens, int sink_pages, int window_tokens,
                                 float scale, int max_pages_per_seq, nb::handle stream,
                                 bool check, double code_channels) {
  require_cuda_kv(kv, "cuda_token_codes_select");
  const Device device = kv.device;
  const kv::PagedKVView view = kv.checked();
  const CodesArrays c =
      codes_of(codes, view.num_pages, view.num_kv_heads, view.page_size, view.head_dim, device);
  cuda::TwoStageSelectArgs a;
  a.q = view3_f32(q, "q", device);
  a.table = view.table;
  a.page_size = view.page_size;
  a.codes = c.view();
  a.codes.num_pages = view.num_pages;
  a.codes.num_kv_heads = view.num_kv_heads;
  a.codes.page_size = view.page_size;
  a.codes.head_dim = view.head_dim;
  a.scale = scale;
  a.budget_tokens = budget_tokens;
  a.sink_pages = sink_pages;
  a.window_tokens = window_tokens;
  a.candidate_factor = 0;  // token_codes: no page stage
  a.code_channels = code_channels;  // 1: one pass (every token on every channel)
  cuda::TwoStageLaunch launch;
  launch.stream = resolve_stream(stream, device);
  launch.max_pages_per_seq = pages_bound(max_pages_per_seq, view);
  launch.check_errors = check;
  a.max_per_head = cuda::two_stage_capacity(launch.max_pages_per_seq, view.page_size,
                                            budget_tokens, sink_pages, window_tokens);
  const auto B = static_cast<std::size_t>(view.table.batch()),
             H = static_cast<std::size_t>(view.num_kv_heads),
             K = static_cast<std::size_t>(a.max_per_head);
  auto [ids_obj, ids] = torch_int32({B, H, K}, device, "ids");
  auto [count_obj, counts] = torch_int32({B, H}, device, "count");
  a.ids = {ids, B * H * K};
  a.count = {counts, B * H};
  run_on_device<cuda::TwoStageWorkspace>(device, launch,
                                         [&] { cuda::two_stage_select(a, launch); });
  return nb::type<Selection>()(ids_obj, count_obj, "token");
}

void check_py(int device, nb::handle stream) {
  if (device < 0) {
    int current = 0;
    if (cudaGetDevice(&current) != cudaSuccess) current = 0;
    device = current;
  }
  check_device_errors(device, resolve_stream(stream, device));
}

int select_capacity_py(int max_pages_per_seq, int page_size, std::int64_t budget_tokens,
                       int sink_pages, int window_tokens) {
  require(max_pages_per_seq >= 1, ErrorCode::invalid_argument, "max_pages_per_seq",
          "must be >= 1, got ", max_pages_per_seq);
  require(page_size >= 1, ErrorCode::invalid_argument, "page_size", "must be >= 1, got ",
          page_size);
  return cuda::select_capacity(
      max_pages_per_seq, page_size,
      quest_policy(budget_tokens, sink_pages, window_tokens, page_size));
}

constexpr const char* kStoresDoc =
    "stores: a dict of CUDA tensors of one device: k_pool, v_pool (bfloat16 or float16,\n"
    "(pages, page_size, H_kv, d) for layout \"NHD\" (the default) or (pages, H_kv, page_size,\n"
    "d) for \"HND\"; same strides, contiguous last axis); the page summaries min, max, mean,\n"
    "m2 (float32 (pages, H_kv, d)), count (int32 (pages,)), max_vnorm (float32 (pages,\n"
    "H_kv)); optionally the bf16 bound store the GPU Quest selector scans: bound_min,\n"
    "bound_max (bfloat16 (pages, H_kv, d)), bound_wmax (float32 (pages, H_kv)). Every store\n"
    "C-contiguous. stream: a cudaStream_t as int (None: torch's current stream). check:\n"
    "wait and raise masskv.Error for a bad id or a non-finite value; False leaves the flag\n"
    "for masskv.cuda_check (CUDA graph capture).";

}  // namespace

void bind_cuda_stores(nb::module_& m) {
  m.def("cuda_append", &append_py, nb::arg("stores"), nb::arg("k").noconvert(),
        nb::arg("v").noconvert(), nb::arg("page").noconvert(), nb::arg("slot").noconvert(),
        nb::kw_only(), nb::arg("stream").none() = nb::none(), nb::arg("check") = true,
        nb::arg("groups").none() = nb::none(),
        nb::sig("def cuda_append(stores: dict, k: numpy.typing.ArrayLike, v: "
                "numpy.typing.ArrayLike, page: numpy.typing.ArrayLike, slot: "
                "numpy.typing.ArrayLike, *, stream: int | None = None, check: bool = True, "
                "groups: dict | None = None) -> None"),
        (std::string("One decode step's append on the GPU (cuda::append): token b's k[b], v[b]\n"
                     "(float32 (B, H_kv, d)) into physical page page[b], slot slot[b] (int32\n"
                     "(B,)), folded into that page's summaries (slot 0 resets them); the same\n"
                     "bits as PagedKVCache.append on the CPU. Pages of one call must differ.\n"
                     "groups: also refresh each sequence's last group of the group store\n"
                     "(cuda::GroupRefresh; cuda_update_groups' bits with last_only, one launch\n"
                     "fewer): a dict of group_min / group_max (bfloat16 (slots, H_kv, d)), the\n"
                     "step's page table indptr / indices and group table group_indptr /\n"
                     "group_indices (int32), optional group_pages (16).\n") +
         kStoresDoc)
            .c_str());
  m.def("cuda_summarize_pages", &summarize_py, nb::arg("stores"), nb::arg("pages").noconvert(),
        nb::arg("tokens").noconvert(), nb::kw_only(), nb::arg("stream").none() = nb::none(),
        nb::arg("check") = true,
        nb::sig("def cuda_summarize_pages(stores: dict, pages: numpy.typing.ArrayLike, tokens: "
                "numpy.typing.ArrayLike, *, stream: int | None = None, check: bool = True) -> "
                "None"),
        (std::string("Rebuilds the summaries of pages written by someone else "
                     "(cuda::summarize_pages):\n"
                     "page pages[i] (int32, distinct) holds tokens[i] tokens in slots 0.. of the\n"
                     "pool; its stores get the bits appending those tokens one by one gives.\n") +
         kStoresDoc)
            .c_str());
  m.def("cuda_encode_page_codes", &encode_codes_py, nb::arg("stores"), nb::arg("codes"),
        nb::arg("pages").noconvert(), nb::arg("tokens").noconvert(), nb::kw_only(),
        nb::arg("stream").none() = nb::none(), nb::arg("check") = true,
        nb::sig("def cuda_encode_page_codes(stores: dict, codes: dict, pages: "
                "numpy.typing.ArrayLike, tokens: numpy.typing.ArrayLike, *, stream: int | None "
                "= None, check: bool = True) -> None"),
        "token_codes' page codes of the listed pages (cuda::encode_page_codes): page pages[i]\n"
        "holds tokens[i] tokens; its 8-bit range from the f32 min/max of `stores`, the codes\n"
        "of its keys and their channel-major copies, into `codes` (a dict of CUDA tensors:\n"
        "codes uint8 (pages, H_kv, page_size, ceil(d / 4)), range_min / range_max uint8 (pages,\n"
        "H_kv, d), grid float32 (pages, H_kv, 2), chan_codes uint8 (H_kv, d, pages,\n"
        "ceil(page_size / 4)), chan_ranges uint8 (H_kv, d, pages, 2), chan_spread float32\n"
        "(pages, H_kv, d)): the bits PagedKVCache(page_codes=True) keeps. stores as\n"
        "cuda_append's; stream and check as decode's.");
  m.def("cuda_update_spread", &update_spread_py, nb::arg("stores"), nb::arg("codes"),
        nb::arg("indptr").noconvert(), nb::arg("indices").noconvert(),
        nb::arg("last_page_len").noconvert(), nb::arg("tokens"), nb::arg("mean").noconvert(),
        nb::arg("m2").noconvert(), nb::kw_only(), nb::arg("stream").none() = nb::none(),
        nb::arg("check") = true, nb::arg("counts").noconvert().none() = nb::none(),
        "The spread rows of a step (cuda::update_spread): each sequence's last `tokens` keys\n"
        "(counts: int32 (B,) per sequence instead, a padded batch's rows; 0 allowed)\n"
        "folded into its float64 Welford moments mean / m2 ((B, H_kv, d), kept by the caller\n"
        "per sequence), the deviation rows written into codes['chan_spread'] at page ends and\n"
        "at the last token.");
  m.def("cuda_token_codes_select", &token_codes_select_py, nb::arg("q").noconvert(),
        nb::arg("kv"), nb::arg("codes"), nb::kw_only(), nb::arg("budget_tokens"),
        nb::arg("sink_pages") = 1, nb::arg("window_tokens") = 0, nb::arg("scale") = 0.0f,
        nb::arg("max_pages_per_seq") = 0, nb::arg("stream").none() = nb::none(),
        nb::arg("check") = true,
        nb::arg("code_channels") = cuda::TwoStageSelectArgs{}.code_channels,
        "token_codes on the GPU (cuda::two_stage_select, no page stage): every token ranked on\n"
        "its page code, two passes, the q heads of a kv group pooled by log-probability — the\n"
        "CPU's token_codes lists. q float32 (B, Hq, d); codes as cuda_encode_page_codes'.\n"
        "code_channels: the first pass's share of the channels (select(code_channels=...)'s;\n"
        "1: one pass, every token on every channel).\n"
        "Returns a token Selection (int32 ids (B, H_kv, capacity) -1 padded, count (B, H_kv))\n"
        "for decode(..., selection=...).");
  m.def("cuda_token_codes_capacity", &cuda::two_stage_capacity, nb::arg("max_pages_per_seq"),
        nb::arg("page_size"), nb::arg("budget_tokens"), nb::arg("sink_pages") = 1,
        nb::arg("window_tokens") = 0,
        "The list length cuda_token_codes_select gives its ids (B, H_kv, capacity) for these\n"
        "arguments (cuda::two_stage_capacity).");
  m.def("cuda_select_capacity", &select_capacity_py, nb::arg("max_pages_per_seq"),
        nb::arg("page_size"), nb::arg("budget_tokens"), nb::arg("sink_pages") = 1,
        nb::arg("window_tokens") = 0,
        "The list length cuda_quest_select gives its ids (B, H_kv, capacity) for these\n"
        "arguments (cuda::select_capacity): size preallocated outputs with it (CUDA graphs).");
  m.def("cuda_check", &check_py, nb::arg("device") = -1, nb::arg("stream").none() = nb::none(),
        "Waits for `stream` on `device` (-1: the current device) and raises masskv.Error for\n"
        "what the kernels of calls made there with check=False flagged (decode, selection,\n"
        "append, prefill: a bad page id, a non-finite value); clears the flags.");
}

}  // namespace masskv::py

#endif
