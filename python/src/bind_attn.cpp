// Selection, decode (dense / sparse), causal prefill (dense / block-sparse) and their f64
// references (docs/design.md §1, §2.6, §4).
#include <optional>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "cuda_calls.hpp"
#include "kv_objects.hpp"
#include "masskv/attn/decode.hpp"
#include "masskv/attn/prefill.hpp"
#include "masskv/error.hpp"

namespace masskv::py {

SelectionView Selection::view() const {
  if (!ids) return storage.view();
  SelectionView v;
  v.unit = unit;
  v.batch = batch;
  v.num_kv_heads = num_kv_heads;
  v.max_per_head = max_per_head;
  v.ids = {static_cast<const std::int32_t*>(ids->data()), ids->size()};
  v.count = {static_cast<const std::int32_t*>(count->data()), count->size()};
  return v;
}

namespace {

// The CPU kernels and references read the pool from the host.
void require_cpu_kv(const KV& kv) {
  if (kv.device == kCpu) return;
  throw nb::value_error(("kv: the pool is on " + device_string(kv.device) +
                         "; this function runs on the CPU (CUDA serves decode)")
                            .c_str());
}

SelectionView::Unit parse_unit(const std::string& s) {
  if (s == "page") return SelectionView::Unit::page;
  if (s == "token") return SelectionView::Unit::token;
  fail(ErrorCode::invalid_argument, "unit", "expected \"page\" or \"token\", got \"", s, "\"");
}

attn::Impl parse_impl(const std::string& s) {
  if (s == "scalar") return attn::Impl::scalar;
  if (s == "simd") return attn::Impl::simd;
  if (s == "fast") return attn::Impl::fast;
  fail(ErrorCode::invalid_argument, "impl", "expected \"scalar\", \"simd\" or \"fast\", got \"", s,
       "\"");
}

void selection_init(Selection* self, nb::handle ids_obj, nb::handle count_obj,
                    const std::string& unit) {
  const InArray ids = as_array(ids_obj, "ids");
  const InArray count = as_array(count_obj, "count");
  const Device device = device_of(ids, "ids");
  require_flat(ids, Elem::i32, "ids", device);
  require_flat(count, Elem::i32, "count", device);
  require_ndim(ids, 3, "ids");
  require_ndim(count, 2, "count");
  if (count.shape(0) != ids.shape(0) || count.shape(1) != ids.shape(1)) {
    throw nb::value_error(("count: shape " + shape_string(count) + " does not match ids' " +
                           shape_string(ids) + "[:2]")
                              .c_str());
  }
  new (self) Selection();
  self->unit = parse_unit(unit);
  self->batch = dim_int(ids, 0, "ids");
  self->num_kv_heads = dim_int(ids, 1, "ids");
  self->max_per_head = dim_int(ids, 2, "ids");
  self->ids = ids;
  self->count = count;
  self->ids_obj = nb::borrow(ids_obj);
  self->count_obj = nb::borrow(count_obj);
  self->device = device;
}

// Everything decode-like calls share: q, kv, mapping, scale, selection, outputs.
struct Outputs {
  OutArray out_keep, lse_keep;
  nb::object out_obj, lse_obj;
  View3<float> out;
  std::span<float> lse;
};

Outputs outputs_for(const View3<const float>& q, nb::handle out, nb::handle lse) {
  Outputs o;
  const auto n0 = static_cast<std::size_t>(q.n0), n1 = static_cast<std::size_t>(q.n1),
             n2 = static_cast<std::size_t>(q.n2);
  if (out.is_none()) {
    float* p = nullptr;
    o.out_obj = new_numpy<float>({n0, n1, n2}, &p);
    o.out = View3<float>::contiguous(p, q.n0, q.n1, q.n2);
  } else {
    o.out = out_view3_f32(out, "out", o.out_keep);
    o.out_obj = nb::borrow(out);
  }
  if (lse.is_none()) {
    float* p = nullptr;
    o.lse_obj = new_numpy<float>({n0, n1}, &p);
    o.lse = {p, n0 * n1};
  } else {
    o.lse = out_span_f32(lse, "lse_or_tau", n0 * n1, o.lse_keep);
    o.lse_obj = nb::borrow(lse);
  }
  return o;
}

// The inputs decode and decode_reference share; `sel` must outlive the returned args.
attn::DecodeArgs decode_args(const InArray& q, const KV& kv, double alpha, float scale,
                             const Selection* selection, SelectionView& sel) {
  require_cpu_kv(kv);
  attn::DecodeArgs a;
  a.q = view3_f32(q, "q");
  a.cache = kv.checked();
  a.mapping = mapping_of(alpha);
  a.scale = scale;
  if (selection != nullptr) {
    sel = selection->view();
    a.selection = &sel;
  }
  return a;
}

nb::tuple decode(InArray q, const KV& kv, double alpha, float scale, const Selection* selection,
                 nb::handle out, nb::handle lse_or_tau, int chunk_pages, const std::string& impl,
                 int max_pages_per_seq, nb::handle stream, bool check) {
#if MASSKV_PY_CUDA
  if (kv.device != kCpu) {
    return decode_cuda(q, kv, mapping_of(alpha), scale, selection, out, lse_or_tau,
                       max_pages_per_seq, stream, check);
  }
#endif
  if (max_pages_per_seq != 0 || !stream.is_none() || !check) {
    throw nb::value_error(
        "max_pages_per_seq / stream / check: CUDA decode only (this KV is on the CPU)");
  }
  if (selection != nullptr && selection->device != kCpu) {
    throw nb::value_error(("selection: lists are on " + device_string(selection->device) +
                           ", the KV on the CPU")
                              .c_str());
  }
  SelectionView sel;
  attn::DecodeArgs a = decode_args(q, kv, alpha, scale, selection, sel);
  Outputs o = outputs_for(a.q, out, lse_or_tau);
  a.out = o.out;
  a.lse_or_tau = o.lse;
  a.chunk_pages = chunk_pages;
  a.impl = parse_impl(impl);
  {
    nb::gil_scoped_release nogil;
    attn::decode(a);
  }
  return nb::make_tuple(o.out_obj, o.lse_obj);
}

// Runs an f64 reference (decode_reference / prefill_reference) into new float64 arrays
// [n0][n1][n2] and [n0][n1]. The references validate the f32 `out` view like the kernels do,
// though they write f64: it points at scratch.
template <class Args, class Reference>
nb::tuple run_reference(Args& a, Reference&& reference) {
  const auto n0 = static_cast<std::size_t>(a.q.n0), n1 = static_cast<std::size_t>(a.q.n1),
             n2 = static_cast<std::size_t>(a.q.n2);
  double* out = nullptr;
  double* lse = nullptr;
  nb::object out_obj = new_numpy<double>({n0, n1, n2}, &out);
  nb::object lse_obj = new_numpy<double>({n0, n1}, &lse);
  std::vector<float> unused(n0 * n1 * n2);
  a.out = View3<float>::contiguous(unused.data(), a.q.n0, a.q.n1, a.q.n2);
  {
    nb::gil_scoped_release nogil;
    reference(a, std::span<double>(out, n0 * n1 * n2), std::span<double>(lse, n0 * n1));
  }
  return nb::make_tuple(out_obj, lse_obj);
}

nb::tuple decode_reference(InArray q, const KV& kv, double alpha, float scale,
                           const Selection* selection) {
  SelectionView sel;
  attn::DecodeArgs a = decode_args(q, kv, alpha, scale, selection, sel);
  return run_reference(a, [](const attn::DecodeArgs& args, std::span<double> o,
                             std::span<double> l) { attn::decode_reference(args, o, l); });
}

// Block mask pieces must outlive the call; `store` holds them.
struct MaskArgs {
  attn::BlockMask mask;
  bool used = false;
};

MaskArgs block_mask_of(const std::optional<InArray>& mask, const std::optional<InArray>& offset,
                       int q_block, int k_block) {
  MaskArgs m;
  if (!mask && !offset) return m;
  if (!mask || !offset) throw nb::value_error("block_mask: pass both block_mask and mask_offset");
  m.mask.mask = flat_span<std::uint8_t>(*mask, Elem::u8, "block_mask");
  m.mask.mask_offset = flat_span<std::int64_t>(*offset, Elem::i64, "mask_offset");
  m.mask.q_block = q_block;
  m.mask.k_block = k_block;
  m.used = true;
  return m;
}

attn::PrefillArgs prefill_args(const InArray& q, const InArray& q_indptr, const KV& kv,
                               double alpha, float scale, const MaskArgs& mask) {
  require_cpu_kv(kv);
  attn::PrefillArgs a;
  a.q = view3_f32(q, "q");
  a.q_indptr = flat_span<std::int32_t>(q_indptr, Elem::i32, "q_indptr");
  a.cache = kv.checked();
  a.mapping = mapping_of(alpha);
  a.scale = scale;
  a.block_mask = mask.used ? &mask.mask : nullptr;
  return a;
}

nb::tuple prefill(InArray q, InArray q_indptr, const KV& kv, double alpha, float scale,
                  std::optional<InArray> block_mask, std::optional<InArray> mask_offset,
                  int q_block, int k_block, nb::handle out, nb::handle lse_or_tau,
                  const std::string& impl) {
  const MaskArgs mask = block_mask_of(block_mask, mask_offset, q_block, k_block);
  attn::PrefillArgs a = prefill_args(q, q_indptr, kv, alpha, scale, mask);
  Outputs o = outputs_for(a.q, out, lse_or_tau);
  a.out = o.out;
  a.lse_or_tau = o.lse;
  a.impl = parse_impl(impl);
  {
    nb::gil_scoped_release nogil;
    attn::prefill(a);
  }
  return nb::make_tuple(o.out_obj, o.lse_obj);
}

nb::tuple prefill_reference(InArray q, InArray q_indptr, const KV& kv, double alpha, float scale,
                            std::optional<InArray> block_mask, std::optional<InArray> mask_offset,
                            int q_block, int k_block) {
  const MaskArgs mask = block_mask_of(block_mask, mask_offset, q_block, k_block);
  attn::PrefillArgs a = prefill_args(q, q_indptr, kv, alpha, scale, mask);
  return run_reference(a, [](const attn::PrefillArgs& args, std::span<double> o,
                             std::span<double> l) { attn::prefill_reference(args, o, l); });
}

constexpr const char* kDecodeDoc =
    "Decode attention of one query token per sequence of `kv` (docs/design.md §1, §2.6).\n\n"
    "q: float32 (B, Hq, d), Hq a multiple of the kv heads; any non-negative strides with a\n"
    "contiguous last axis (not copied). alpha: 1 = softmax, (1, 2] = alpha-entmax. scale: 0\n"
    "means 1/sqrt(d). selection: None = dense, else only the selected pages/tokens are read.\n"
    "out: float32 (B, Hq, d) written in place when given; lse_or_tau: float32 (B, Hq)\n"
    "C-contiguous. Returns (out, lse_or_tau): softmax log-sum-exp (natural log) or the entmax\n"
    "threshold tau. impl: \"fast\" (SIMD + threads), \"simd\", \"scalar\"; same chunking, so\n"
    "results do not depend on the thread count.\n\n"
    "CUDA build, KV over CUDA tensors (KV.from_arrays): runs the CUDA kernel on the pool's\n"
    "device; q, out, lse_or_tau and the selection must be on that device; out/lse_or_tau are\n"
    "allocated with torch when None. max_pages_per_seq bounds the pages of any sequence (0:\n"
    "the page table's length) to size the split-K grid without reading the device table;\n"
    "stream: a cudaStream_t as int (None: torch's current stream when torch is loaded, else\n"
    "the default stream). Waits for the step and raises masskv.Error on a bad page id;\n"
    "check=False returns at once and leaves that to masskv.cuda_check (CUDA graphs).";

constexpr const char* kPrefillDoc =
    "Causal prefill over `kv`: the queries of sequence b are rows q_indptr[b]..q_indptr[b+1]\n"
    "of q (float32 (total_q, Hq, d)) and are the last tokens of that sequence in the cache\n"
    "(append them first). block_mask (uint8, flat) + mask_offset (int64 (B,)) select\n"
    "(q_block x k_block) blocks per sequence; None = dense causal. Returns (out, lse_or_tau)\n"
    "as decode.";

}  // namespace

void bind_attn(nb::module_& m) {
  nb::class_<Selection>(
      m, "Selection",
      "Per (sequence, kv head) ascending logical page (or token) ids padded with -1, plus a\n"
      "count (docs/design.md §3). From a selector, or Selection(ids, count, unit) over caller\n"
      "int32 arrays (borrowed, not copied).")
      .def("__init__", &selection_init, nb::arg("ids"), nb::arg("count"),
           nb::arg("unit") = "page",
           nb::sig("def __init__(self, ids: numpy.typing.ArrayLike, count: "
                   "numpy.typing.ArrayLike, unit: str = 'page') -> None"),
           "ids: int32 (B, H_kv, max_per_head) C-contiguous; count: int32 (B, H_kv); on the CPU,\n"
           "or (CUDA build) both on the CUDA device of the KV they select from.")
      .def_prop_ro("device", [](const Selection& s) { return device_string(s.device); })
      .def_prop_ro(
          "unit",
          [](const Selection& s) {
            return std::string(s.view().unit == SelectionView::Unit::page ? "page" : "token");
          })
      .def_prop_ro("batch", [](const Selection& s) { return s.view().batch; })
      .def_prop_ro("num_kv_heads", [](const Selection& s) { return s.view().num_kv_heads; })
      .def_prop_ro("max_per_head", [](const Selection& s) { return s.view().max_per_head; })
      .def_prop_ro(
          "ids",
          [](nb::handle self) -> nb::object {
            const Selection& sel = nb::cast<const Selection&>(self);
            if (sel.ids) return sel.ids_obj;  // borrowed: the caller's own array (any device)
            const SelectionView v = sel.view();
            return numpy_view(
                v.ids.data(),
                {static_cast<std::size_t>(v.batch), static_cast<std::size_t>(v.num_kv_heads),
                 static_cast<std::size_t>(v.max_per_head)},
                nb::dtype<std::int32_t>(), self);
          },
          "int32 (B, H_kv, max_per_head): a read-only zero-copy view of a selector's lists, or\n"
          "the caller's own array for Selection(ids, count).")
      .def_prop_ro(
          "count",
          [](nb::handle self) -> nb::object {
            const Selection& sel = nb::cast<const Selection&>(self);
            if (sel.count) return sel.count_obj;
            const SelectionView v = sel.view();
            return numpy_view(
                v.count.data(),
                {static_cast<std::size_t>(v.batch), static_cast<std::size_t>(v.num_kv_heads)},
                nb::dtype<std::int32_t>(), self);
          },
          "int32 (B, H_kv), like ids.");

  m.def("decode", &decode, nb::arg("q").noconvert(), nb::arg("kv"), nb::kw_only(),
        nb::arg("alpha") = 1.0, nb::arg("scale") = 0.0f, nb::arg("selection").none() = nb::none(),
        nb::arg("out").none() = nb::none(), nb::arg("lse_or_tau").none() = nb::none(),
        nb::arg("chunk_pages") = 64, nb::arg("impl") = "fast", nb::arg("max_pages_per_seq") = 0,
        nb::arg("stream").none() = nb::none(), nb::arg("check") = true,
        nb::sig("def decode(q: numpy.typing.ArrayLike, kv: KV, *, alpha: float = 1.0, scale: float "
                "= 0.0, "
                "selection: Selection | None = None, out: numpy.typing.ArrayLike | None = None, "
                "lse_or_tau: numpy.typing.ArrayLike | None = None, chunk_pages: int = 64, impl: "
                "str = 'fast', max_pages_per_seq: int = 0, stream: int | None = None, check: bool = True) "
                "-> tuple[numpy.typing.ArrayLike, numpy.typing.ArrayLike]"),
        kDecodeDoc);
  m.def("decode_reference", &decode_reference, nb::arg("q").noconvert(), nb::arg("kv"),
        nb::kw_only(), nb::arg("alpha") = 1.0, nb::arg("scale") = 0.0f,
        nb::arg("selection").none() = nb::none(),
        nb::sig("def decode_reference(q: numpy.typing.ArrayLike, kv: KV, *, alpha: float = 1.0, "
                "scale: float = 0.0, selection: Selection | None = None) "
                "-> tuple[numpy.ndarray, numpy.ndarray]"),
        "The plain f64 reference of decode (no chunking); returns float64 (out, lse_or_tau).");
  m.def("prefill", &prefill, nb::arg("q").noconvert(), nb::arg("q_indptr").noconvert(),
        nb::arg("kv"), nb::kw_only(), nb::arg("alpha") = 1.0, nb::arg("scale") = 0.0f,
        nb::arg("block_mask").noconvert().none() = nb::none(),
        nb::arg("mask_offset").noconvert().none() = nb::none(), nb::arg("q_block") = 64,
        nb::arg("k_block") = 64, nb::arg("out").none() = nb::none(),
        nb::arg("lse_or_tau").none() = nb::none(), nb::arg("impl") = "fast",
        nb::sig("def prefill(q: numpy.typing.ArrayLike, q_indptr: numpy.typing.ArrayLike, kv: KV, "
                "*, alpha: float = 1.0, "
                "scale: float = 0.0, block_mask: numpy.typing.ArrayLike | None = None, "
                "mask_offset: numpy.typing.ArrayLike | None = None, q_block: int = 64, k_block: "
                "int = 64, "
                "out: numpy.typing.ArrayLike | None = None, lse_or_tau: numpy.typing.ArrayLike | "
                "None = None, "
                "impl: str = 'fast') -> tuple[numpy.typing.ArrayLike, numpy.typing.ArrayLike]"),
        kPrefillDoc);
  m.def("prefill_reference", &prefill_reference, nb::arg("q").noconvert(),
        nb::arg("q_indptr").noconvert(), nb::arg("kv"), nb::kw_only(), nb::arg("alpha") = 1.0,
        nb::arg("scale") = 0.0f, nb::arg("block_mask").noconvert().none() = nb::none(),
        nb::arg("mask_offset").noconvert().none() = nb::none(), nb::arg("q_block") = 64,
        nb::arg("k_block") = 64,
        nb::sig("def prefill_reference(q: numpy.typing.ArrayLike, q_indptr: "
                "numpy.typing.ArrayLike, kv: KV, *, "
                "alpha: float = 1.0, scale: float = 0.0, block_mask: numpy.typing.ArrayLike | None "
                "= None, "
                "mask_offset: numpy.typing.ArrayLike | None = None, q_block: int = 64, k_block: "
                "int = 64) "
                "-> tuple[numpy.ndarray, numpy.ndarray]"),
        "The plain f64 reference of prefill; returns float64 (out, lse_or_tau).");
}

}  // namespace masskv::py
