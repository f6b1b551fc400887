// CUDA paths of the bindings (see cuda_calls.hpp). Compiled only in CUDA builds.
#include "cuda_calls.hpp"

#if MASSKV_PY_CUDA

#include <cuda_runtime.h>
#include <nanobind/stl/pair.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "cuda_device.hpp"
#include "engine_outputs.hpp"
#include "masskv/cuda/decode.hpp"
#include "masskv/cuda/select.hpp"
#include "masskv/error.hpp"

namespace masskv::py {

int pages_bound(int max_pages_per_seq, const kv::PagedKVView& v) {
  if (max_pages_per_seq < 0) {
    fail(ErrorCode::invalid_argument, "max_pages_per_seq", "must be >= 0, got ",
         max_pages_per_seq);
  }
  if (max_pages_per_seq > 0) return max_pages_per_seq;
  return std::max<int>(1, static_cast<int>(v.table.indices.size()));
}

void require_cuda_kv(const KV& kv, const char* what) {
  if (kv.device != kCpu) return;
  throw nb::value_error((std::string("kv: the pool is on the CPU; ") + what +
                         " runs on CUDA tensors (KV.from_arrays over device tensors)")
                            .c_str());
}


select::TopkPolicy quest_policy(std::int64_t budget_tokens, int sink_pages, int window_tokens,
                                int page_size) {
  if (budget_tokens <= 0) {
    fail(ErrorCode::invalid_argument, "budget_tokens", "must be > 0, got ", budget_tokens);
  }
  select::TopkPolicy p;
  p.budget_pages = static_cast<int>((budget_tokens + page_size - 1) / page_size);
  p.sink_pages = sink_pages;
  p.window_tokens = window_tokens;
  return p;
}

nb::tuple decode_cuda(const InArray& q, const KV& kv, Mapping mapping, float scale,
                      const Selection* selection, nb::handle out, nb::handle lse_or_tau,
                      int max_pages_per_seq, nb::handle stream, bool check) {
  const Device device = kv.device;
  attn::DecodeArgs a;
  a.q = view3_f32(q, "q", device);
  a.cache = kv.checked();
  a.mapping = mapping;
  a.scale = scale;
  SelectionView sel;
  if (selection != nullptr) {
    if (selection->device != device) {
      throw nb::value_error(("selection: lists are on " + device_string(selection->device) +
                             ", the KV on " + device_string(device))
                                .c_str());
    }
    sel = selection->view();
    a.selection = &sel;
  }
  const auto B = static_cast<std::size_t>(a.q.n0), Hq = static_cast<std::size_t>(a.q.n1),
             d = static_cast<std::size_t>(a.q.n2);
  nb::object out_obj = out.is_none() ? torch_empty({B, Hq, d}, "float32", device, "out")
                                     : nb::borrow(out);
  nb::object lse_obj = lse_or_tau.is_none()
                           ? torch_empty({B, Hq}, "float32", device, "lse_or_tau")
                           : nb::borrow(lse_or_tau);
  OutArray out_keep, lse_keep;
  a.out = out_view3_f32(out_obj, "out", out_keep, device);
  a.lse_or_tau = out_span_f32(lse_obj, "lse_or_tau", B * Hq, lse_keep, device);

  cuda::DecodeLaunch launch;
  launch.stream = resolve_stream(stream, device);
  launch.max_pages_per_seq = pages_bound(max_pages_per_seq, a.cache);
  launch.check_errors = check;
  run_on_device<cuda::DecodeWorkspace>(device, launch, [&] { cuda::decode(a, launch); });
  return nb::make_tuple(out_obj, lse_obj);
}

namespace {

// A bf16 store [rows][H_kv][head_dim] on `device` (page bounds: rows = the pool's pages; group
// bounds: the group slots, rows < 0 = any).
void require_bf16_store(const InArray& a, const char* name, Device device,
                        const kv::PagedKVView& view, long rows) {
  require_flat(a, Elem::bf16, name, device);
  require_ndim(a, 3, name);
  if ((rows >= 0 && a.shape(0) != static_cast<std::size_t>(rows)) ||
      a.shape(1) != static_cast<std::size_t>(view.num_kv_heads) ||
      a.shape(2) != static_cast<std::size_t>(view.head_dim)) {
    throw nb::value_error((std::string(name) + ": expected (" +
                           (rows >= 0 ? std::to_string(rows) : std::string("rows")) + ", H_kv, head_dim) = (" +
                           (rows >= 0 ? std::to_string(rows) + ", " : std::string("..., ")) +
                           std::to_string(view.num_kv_heads) + ", " +
                           std::to_string(view.head_dim) + ") bfloat16, got " + shape_string(a))
                              .c_str());
  }
}

select::BoundStoreView bound_view(const InArray& lo, const InArray& hi, const kv::PagedKVView& v) {
  select::BoundStoreView b;
  b.min = static_cast<const bf16*>(lo.data());
  b.max = static_cast<const bf16*>(hi.data());
  b.num_pages = static_cast<int>(lo.shape(0));
  b.num_kv_heads = v.num_kv_heads;
  b.head_dim = v.head_dim;
  return b;
}

// The page-level arguments every GPU Quest selection takes (flat and hierarchical), and its
// launch: the kv's table, the bf16 page store, q, the policy of a token budget.
cuda::QuestSelectArgs page_args(const InArray& q, const kv::PagedKVView& view, Device device,
                                const InArray& bounds_min, const InArray& bounds_max,
                                std::int64_t budget_tokens, int sink_pages, int window_tokens,
                                float scale) {
  cuda::QuestSelectArgs a;
  a.q = view3_f32(q, "q", device);
  a.table = view.table;
  a.page_size = view.page_size;
  require_bf16_store(bounds_min, "bounds_min", device, view, view.num_pages);
  require_bf16_store(bounds_max, "bounds_max", device, view, view.num_pages);
  a.bounds = bound_view(bounds_min, bounds_max, view);
  a.scale = scale;
  a.policy = quest_policy(budget_tokens, sink_pages, window_tokens, view.page_size);
  return a;
}

cuda::SelectLaunch select_launch(nb::handle stream, Device device, int max_pages_per_seq,
                                 const kv::PagedKVView& view, bool check) {
  cuda::SelectLaunch launch;
  launch.stream = resolve_stream(stream, device);
  launch.max_pages_per_seq = pages_bound(max_pages_per_seq, view);
  launch.check_errors = check;
  return launch;
}

// The selection's outputs: the caller's ids / count, or new torch tensors of the capacity
// select_capacity gives; sets a.ids, a.count, a.max_per_head.
std::pair<nb::object, nb::object> list_outputs(cuda::QuestSelectArgs& a,
                                               const cuda::SelectLaunch& launch, Device device,
                                               nb::handle ids, nb::handle count) {
  a.max_per_head = cuda::select_capacity(launch.max_pages_per_seq, a.page_size, a.policy);
  const auto B = static_cast<std::size_t>(a.table.batch()),
             H = static_cast<std::size_t>(a.bounds.num_kv_heads),
             K = static_cast<std::size_t>(a.max_per_head);
  nb::object ids_obj = ids.is_none() ? torch_empty({B, H, K}, "int32", device, "ids")
                                     : nb::borrow(ids);
  nb::object count_obj = count.is_none() ? torch_empty({B, H}, "int32", device, "count")
                                         : nb::borrow(count);
  OutArray ids_keep = as_output(ids_obj, "ids"), count_keep = as_output(count_obj, "count");
  require_flat(as_input(ids_keep), Elem::i32, "ids", device);
  require_flat(as_input(count_keep), Elem::i32, "count", device);
  if (ids_keep.ndim() != 3 || ids_keep.shape(0) != B || ids_keep.shape(1) != H ||
      ids_keep.shape(2) < K || count_keep.size() != B * H) {
    throw nb::value_error(("ids / count: expected int32 (" + std::to_string(B) + ", " +
                           std::to_string(H) + ", >= " + std::to_string(K) + ") and (" +
                           std::to_string(B) + ", " + std::to_string(H) + ")")
                              .c_str());
  }
  a.max_per_head = static_cast<int>(ids_keep.shape(2));
  a.ids = {static_cast<std::int32_t*>(ids_keep.data()), ids_keep.size()};
  a.count = {static_cast<std::int32_t*>(count_keep.data()), count_keep.size()};
  return {ids_obj, count_obj};
}

}  // namespace

nb::object quest_select_cuda(const InArray& q, const KV& kv, const InArray& bounds_min,
                             const InArray& bounds_max, std::int64_t budget_tokens,
                             int sink_pages, int window_tokens, float scale,
                             int max_pages_per_seq, nb::handle ids, nb::handle count,
                             nb::handle stream, bool check) {
  require_cuda_kv(kv, "cuda_quest_select");
  const Device device = kv.device;
  const kv::PagedKVView view = kv.checked();
  cuda::QuestSelectArgs a = page_args(q, view, device, bounds_min, bounds_max, budget_tokens,
                                      sink_pages, window_tokens, scale);
  cuda::SelectLaunch launch = select_launch(stream, device, max_pages_per_seq, view, check);
  auto [ids_obj, count_obj] = list_outputs(a, launch, device, ids, count);
  run_on_device<cuda::SelectWorkspace>(device, launch, [&] { cuda::quest_select(a, launch); });
  return nb::type<Selection>()(ids_obj, count_obj, "page");
}

nb::object hier_select_cuda(const InArray& q, const KV& kv, const InArray& bounds_min,
                            const InArray& bounds_max, const InArray& group_min,
                            const InArray& group_max, const InArray& group_indptr,
                            const InArray& group_indices, std::int64_t budget_tokens,
                            int sink_pages, int window_tokens, float scale, double cover,
                            int max_pages_per_seq, nb::handle ids, nb::handle count,
                            nb::handle stream, bool check) {
  require_cuda_kv(kv, "cuda_hier_select");
  const Device device = kv.device;
  const kv::PagedKVView view = kv.checked();
  cuda::HierSelectArgs h;
  h.pages = page_args(q, view, device, bounds_min, bounds_max, budget_tokens, sink_pages,
                      window_tokens, scale);
  require_bf16_store(group_min, "group_min", device, view, -1);
  require_bf16_store(group_max, "group_max", device, view,
                     static_cast<long>(group_min.shape(0)));
  h.groups = bound_view(group_min, group_max, view);
  h.group_indptr = flat_span<std::int32_t>(group_indptr, Elem::i32, "group_indptr", device);
  h.group_indices = flat_span<std::int32_t>(group_indices, Elem::i32, "group_indices", device);
  if (h.group_indptr.size() != view.table.indptr.size()) {
    throw nb::value_error(("group_indptr: expected batch + 1 = " +
                           std::to_string(view.table.indptr.size()) + " entries, got " +
                           std::to_string(h.group_indptr.size()))
                              .c_str());
  }
  h.cover = cover;
  cuda::SelectLaunch launch = select_launch(stream, device, max_pages_per_seq, view, check);
  auto [ids_obj, count_obj] = list_outputs(h.pages, launch, device, ids, count);
  run_on_device<cuda::SelectWorkspace>(device, launch, [&] { cuda::hier_select(h, launch); });
  return nb::type<Selection>()(ids_obj, count_obj, "page");
}

void update_groups_cuda(const KV& kv, const InArray& bounds_min, const InArray& bounds_max,
                        const InArray& group_min, const InArray& group_max,
                        const InArray& group_indptr, const InArray& group_indices,
                        bool last_only, int max_pages_per_seq, nb::handle stream, bool check) {
  require_cuda_kv(kv, "cuda_update_groups");
  const Device device = kv.device;
  const kv::PagedKVView view = kv.checked();
  require_bf16_store(bounds_min, "bounds_min", device, view, view.num_pages);
  require_bf16_store(bounds_max, "bounds_max", device, view, view.num_pages);
  require_bf16_store(group_min, "group_min", device, view, -1);
  require_bf16_store(group_max, "group_max", device, view, static_cast<long>(group_min.shape(0)));
  cuda::GroupUpdateArgs g;
  g.table = view.table;
  g.pages = bound_view(bounds_min, bounds_max, view);
  g.group_indptr = flat_span<std::int32_t>(group_indptr, Elem::i32, "group_indptr", device);
  g.group_indices = flat_span<std::int32_t>(group_indices, Elem::i32, "group_indices", device);
  g.group_min = static_cast<bf16*>(const_cast<void*>(group_min.data()));
  g.group_max = static_cast<bf16*>(const_cast<void*>(group_max.data()));
  g.group_slots = static_cast<int>(group_min.shape(0));
  g.last_only = last_only;
  cuda::SelectLaunch launch = select_launch(stream, device, max_pages_per_seq, view, check);
  run_on_device<cuda::SelectWorkspace>(device, launch, [&] { cuda::update_groups(g, launch); });
}

nb::dict engine_pages_cuda(const Selection& sel, const KV& kv, kv::EngineLists lists,
                           int max_per_list, bool csr, int max_pages_per_seq, nb::handle stream,
                           bool check) {
  const Device device = kv.device;
  const kv::PagedKVView view = kv.checked();
  cuda::EnginePagesArgs a;
  a.selection = sel.view();
  a.table = view.table;
  a.page_size = view.page_size;
  a.lists = lists;
  const auto L = static_cast<std::size_t>(
      kv::engine_list_count(lists, view.table.batch(), a.selection.num_kv_heads));
  nb::dict d = engine_outputs(
      L, static_cast<std::size_t>(max_per_list), csr, a.out,
      [&](const char* name, std::vector<std::size_t> shape) {
        return torch_int32(shape, device, name);
      });
  cuda::SelectLaunch launch;
  launch.stream = resolve_stream(stream, device);
  launch.max_pages_per_seq = pages_bound(max_pages_per_seq, view);
  launch.check_errors = check;
  run_on_device<cuda::SelectWorkspace>(device, launch, [&] { cuda::engine_pages(a, launch); });
  return d;
}

}  // namespace masskv::py

#endif
