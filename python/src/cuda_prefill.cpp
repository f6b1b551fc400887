// masskv.cuda_prefill (CUDA builds only): causal prefill over a KV of CUDA tensors, dense or
// block-sparse with the key blocks chosen by the mean-pooled block indexer (cuda::prefill_index,
// then cuda::prefill). The queries and the output are in the pool's dtype (bf16 or f16), as the
// tensor-core kernels take them; the log-sum-exp is f32.
#include "bindings.hpp"

#if MASSKV_PY_CUDA

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include "cuda_calls.hpp"
#include "cuda_device.hpp"
#include "kv_objects.hpp"
#include "masskv/cuda/prefill.hpp"
#include "masskv/error.hpp"

namespace masskv::py {

namespace {

Elem half_elem(DType t) {
  if (t == DType::bf16) return Elem::bf16;
  if (t == DType::f16) return Elem::f16;
  throw nb::type_error("kv: cuda_prefill takes a bfloat16 or float16 pool");
}

// A [n0][n1][n2] array of 16-bit elements of type e on `device`, unit last stride and
// non-negative others (the kernels check the 16-byte row alignment they need).
View3<const std::uint16_t> view3_half(const InArray& a, Elem e, const char* name, Device device) {
  require_device(a, device, name);
  require_dtype(a, e, name);
  require_ndim(a, 3, name);
  View3<const std::uint16_t> v;
  v.data = static_cast<const std::uint16_t*>(a.data());
  v.n0 = dim_int(a, 0, name);
  v.n1 = dim_int(a, 1, name);
  v.n2 = dim_int(a, 2, name);
  v.s1 = v.n1 <= 1 ? v.n2 : a.stride(1);
  v.s0 = v.n0 <= 1 ? static_cast<std::int64_t>(v.n1) * v.s1 : a.stride(0);
  if ((v.n2 > 1 && a.stride(2) != 1) || v.s0 < 0 || v.s1 < 0) {
    throw nb::value_error((std::string(name) +
                           ": the last axis must be contiguous and the other strides "
                           "non-negative")
                              .c_str());
  }
  return v;
}

nb::tuple prefill_py(const InArray& q, const InArray& q_indptr, const KV& kv, float scale,
                     int budget_blocks, std::optional<InArray> q_block_indptr, int q_blocks,
                     int q_block, int k_block, int sink_blocks, int max_q_per_seq,
                     int max_kv_len, nb::handle out, nb::handle lse, nb::handle stream,
                     bool check) {
  require_cuda_kv(kv, "cuda_prefill");
  const Device device = kv.device;
  cuda::PrefillArgs a;
  a.cache = kv.checked();
  const Elem e = half_elem(a.cache.dtype);
  const char* dtype = e == Elem::bf16 ? "bfloat16" : "float16";
  a.q = view3_half(q, e, "q", device);
  a.q_indptr = flat_span<std::int32_t>(q_indptr, Elem::i32, "q_indptr", device);
  a.scale = scale;
  require(max_q_per_seq >= 1, ErrorCode::invalid_argument, "max_q_per_seq",
          "must be >= 1 (a host bound on new tokens per sequence), got ", max_q_per_seq);
  const auto T = static_cast<std::size_t>(a.q.n0), Hq = static_cast<std::size_t>(a.q.n1),
             d = static_cast<std::size_t>(a.q.n2);
  nb::object out_obj = out.is_none() ? torch_empty({T, Hq, d}, dtype, device, "out")
                                     : nb::borrow(out);
  nb::object lse_obj = lse.is_none() ? torch_empty({T, Hq}, "float32", device, "lse")
                                     : nb::borrow(lse);
  OutArray out_keep, lse_keep;
  out_keep = as_output(out_obj, "out");
  const View3<const std::uint16_t> ov = view3_half(InArray(out_keep), e, "out", device);
  if (ov.n0 != a.q.n0 || ov.n1 != a.q.n1 || ov.n2 != a.q.n2) {
    throw nb::value_error("out: expected the shape of q");
  }
  a.out = cuda::PrefillOut{const_cast<std::uint16_t*>(ov.data), a.cache.dtype, ov.s0, ov.s1};
  a.lse = out_span_f32(lse_obj, "lse", T * Hq, lse_keep, device);

  cuda::PrefillLaunch launch;
  launch.stream = resolve_stream(stream, device);
  launch.max_q_per_seq = max_q_per_seq;
  launch.check_errors = check;

  // Block-sparse: the indexer's lists (one per query block and kv head), then the prefill.
  nb::object ids_obj = nb::none(), count_obj = nb::none();
  cuda::PrefillIndexArgs ia;
  cuda::PrefillBlockSelection sel;
  if (budget_blocks > 0) {
    if (!q_block_indptr) {
      throw nb::value_error("q_block_indptr: a block-sparse prefill (budget_blocks > 0) needs "
                            "the query blocks' CSR offsets (int32 (B + 1,), on the device)");
    }
    require(q_blocks >= 1, ErrorCode::invalid_argument, "q_blocks",
            "must be >= 1 (the query blocks of every sequence), got ", q_blocks);
    require(max_kv_len >= 1, ErrorCode::invalid_argument, "max_kv_len",
            "must be >= 1 with budget_blocks > 0, got ", max_kv_len);
    const int cap =
        cuda::prefill_index_capacity(max_kv_len, q_block, k_block, budget_blocks, sink_blocks);
    const auto H = static_cast<std::size_t>(a.cache.num_kv_heads);
    const auto R = static_cast<std::size_t>(q_blocks), C = static_cast<std::size_t>(cap);
    std::int32_t* ids = nullptr;
    std::int32_t* counts = nullptr;
    std::tie(ids_obj, ids) = torch_int32({R, H, C}, device, "block_ids");
    std::tie(count_obj, counts) = torch_int32({R, H}, device, "block_count");
    ia.q = a.q;
    ia.q_indptr = a.q_indptr;
    ia.cache = a.cache;
    ia.q_block = q_block;
    ia.k_block = k_block;
    ia.budget_blocks = budget_blocks;
    ia.sink_blocks = sink_blocks;
    ia.max_kv_len = max_kv_len;
    ia.q_block_indptr =
        flat_span<std::int32_t>(*q_block_indptr, Elem::i32, "q_block_indptr", device);
    ia.max_per_row = cap;
    ia.ids = {ids, R * H * C};
    ia.count = {counts, R * H};
    sel.q_block = q_block;
    sel.k_block = k_block;
    sel.num_heads = static_cast<int>(H);
    sel.max_per_row = cap;
    sel.q_block_indptr = ia.q_block_indptr;
    sel.ids = ia.ids;
    sel.count = ia.count;
    a.selection = &sel;
  } else if (budget_blocks < 0) {
    fail(ErrorCode::invalid_argument, "budget_blocks", "must be >= 0 (0: dense), got ",
         budget_blocks);
  }
  run_on_device<cuda::PrefillWorkspace>(device, launch, [&] {
    if (a.selection != nullptr) cuda::prefill_index(ia, launch);
    cuda::prefill(a, launch);
  });
  return nb::make_tuple(out_obj, lse_obj, ids_obj, count_obj);
}

int index_capacity_py(std::int64_t max_kv_len, int q_block, int k_block, int budget_blocks,
                      int sink_blocks) {
  return cuda::prefill_index_capacity(max_kv_len, q_block, k_block, budget_blocks, sink_blocks);
}

}  // namespace

void bind_cuda_prefill(nb::module_& m) {
  m.def("cuda_prefill", &prefill_py, nb::arg("q").noconvert(), nb::arg("q_indptr").noconvert(),
        nb::arg("kv"), nb::kw_only(), nb::arg("scale") = 0.0f, nb::arg("budget_blocks") = 0,
        nb::arg("q_block_indptr").noconvert().none() = nb::none(), nb::arg("q_blocks") = 0,
        nb::arg("q_block") = 64, nb::arg("k_block") = 64, nb::arg("sink_blocks") = 1,
        nb::arg("max_q_per_seq") = 0, nb::arg("max_kv_len") = 0, nb::arg("out").none() = nb::none(),
        nb::arg("lse").none() = nb::none(), nb::arg("stream").none() = nb::none(),
        nb::arg("check") = true,
        nb::sig("def cuda_prefill(q: numpy.typing.ArrayLike, q_indptr: numpy.typing.ArrayLike, "
                "kv: KV, *, scale: float = 0.0, budget_blocks: int = 0, q_block_indptr: "
                "numpy.typing.ArrayLike | None = None, q_blocks: int = 0, q_block: int = 64, "
                "k_block: int = 64, sink_blocks: int = 1, max_q_per_seq: int = 0, max_kv_len: int "
                "= 0, out: numpy.typing.ArrayLike | None = None, lse: numpy.typing.ArrayLike | "
                "None = None, stream: int | None = None, check: bool = True) -> tuple"),
        "Causal softmax prefill on the GPU (cuda::prefill) over kv (KV.from_arrays over CUDA\n"
        "tensors, bf16 or f16 pool, the new tokens already appended). q: (total_q, Hq, d) in\n"
        "the pool's dtype; sequence b's queries are rows q_indptr[b]..q_indptr[b+1] (int32,\n"
        "on the device), its last tokens. max_q_per_seq: a host bound on new tokens per\n"
        "sequence (sizes the grid). budget_blocks 0: dense; > 0: block-sparse, the mean-pooled\n"
        "indexer (cuda::prefill_index) keeps per query block and kv head the sink blocks, the\n"
        "diagonal and the best others up to budget_blocks key blocks; it needs q_block_indptr\n"
        "(int32 (B + 1,): sequence b's query blocks, ceil(n_b / q_block) each), q_blocks (their\n"
        "total) and max_kv_len (a host bound on tokens per sequence). q_block, k_block: 64 or\n"
        "128. Returns (out (total_q, Hq, d) pool dtype, lse float32 (total_q, Hq), block_ids,\n"
        "block_count): the indexer's int32 lists (q_blocks, H_kv, capacity) -1 padded and\n"
        "counts (q_blocks, H_kv), None when dense. stream and check as decode's.");
  m.def("cuda_prefill_index_capacity", &index_capacity_py, nb::arg("max_kv_len"),
        nb::arg("q_block"), nb::arg("k_block"), nb::arg("budget_blocks"),
        nb::arg("sink_blocks") = 1,
        "The list length of cuda_prefill's block_ids for these arguments\n"
        "(cuda::prefill_index_capacity).");
}

}  // namespace masskv::py

#endif
