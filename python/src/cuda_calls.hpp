// The CUDA paths of the bindings (CUDA builds only: MASSKV_PY_CUDA): decode over a KV whose
// pool and page table are CUDA tensors, and Quest selection on the GPU. Arrays stay where they
// are (DLPack, no copies); outputs the caller does not pass are allocated with torch.
#pragma once

#if MASSKV_PY_CUDA

#include "arrays.hpp"
#include "kv_objects.hpp"
#include "masskv/kv/engine_pages.hpp"
#include "masskv/mapping.hpp"
#include "masskv/select/page_bound.hpp"

namespace masskv::py {

// Host bound on pages per sequence: the caller's max_pages_per_seq, else every page of the
// table (Error(invalid_argument, "max_pages_per_seq") when negative).
int pages_bound(int max_pages_per_seq, const kv::PagedKVView& v);

// Raises ValueError naming `what` when kv's pool is on the CPU.
void require_cuda_kv(const KV& kv, const char* what);

// masskv.decode for kv.device >= 0. Returns (out, lse_or_tau) like the CPU path.
nb::tuple decode_cuda(const InArray& q, const KV& kv, Mapping mapping, float scale,
                      const Selection* selection, nb::handle out, nb::handle lse_or_tau,
                      int max_pages_per_seq, nb::handle stream, bool check);

// The GPU Quest policy of a token budget: ceil(budget_tokens / page_size) pages besides the kept
// ones (sinks, window, last page). Error(invalid_argument, "budget_tokens") unless > 0.
select::TopkPolicy quest_policy(std::int64_t budget_tokens, int sink_pages, int window_tokens,
                                int page_size);

// masskv.cuda_quest_select: the GPU Quest selector (cuda::quest_select) over bf16 page bounds
// already on the device. Returns a Selection borrowing device int32 ids/count.
nb::object quest_select_cuda(const InArray& q, const KV& kv, const InArray& bounds_min,
                             const InArray& bounds_max, std::int64_t budget_tokens,
                             int sink_pages, int window_tokens, float scale,
                             int max_pages_per_seq, nb::handle ids, nb::handle count,
                             nb::handle stream, bool check);

// masskv.cuda_hier_select: hierarchical Quest on the GPU (cuda::hier_select) over the page
// store and a group store (16 pages a group) with its group table; the same output.
nb::object hier_select_cuda(const InArray& q, const KV& kv, const InArray& bounds_min,
                            const InArray& bounds_max, const InArray& group_min,
                            const InArray& group_max, const InArray& group_indptr,
                            const InArray& group_indices, std::int64_t budget_tokens,
                            int sink_pages, int window_tokens, float scale, double cover,
                            int max_pages_per_seq, nb::handle ids, nb::handle count,
                            nb::handle stream, bool check);

// masskv.cuda_update_groups: the group store recomputed from the page store (cuda::update_groups).
void update_groups_cuda(const KV& kv, const InArray& bounds_min, const InArray& bounds_max,
                        const InArray& group_min, const InArray& group_max,
                        const InArray& group_indptr, const InArray& group_indices,
                        bool last_only, int max_pages_per_seq, nb::handle stream, bool check);

// masskv.engine_pages over lists and a page table on a CUDA device (cuda::engine_pages) into
// torch int32 tensors; the dict of the CPU path. check: wait and raise (else masskv.cuda_check).
nb::dict engine_pages_cuda(const Selection& sel, const KV& kv, kv::EngineLists lists,
                           int max_per_list, bool csr, int max_pages_per_seq, nb::handle stream,
                           bool check);

}  // namespace masskv::py

#endif
