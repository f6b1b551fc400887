// One function per group of bindings (module.cpp calls them in order) and the helpers they
// share.
#pragma once

#include <nanobind/nanobind.h>

#include <string_view>

#include <cstdint>
#include <string>

#include "masskv/kv/paged_kv.hpp"
#include "masskv/mapping.hpp"
#include "masskv/select/selector.hpp"

namespace masskv::py {

namespace nb = nanobind;

void bind_mapping(nb::module_& m);
void bind_cache(nb::module_& m);
void bind_attn(nb::module_& m);
void bind_select(nb::module_& m);
void bind_model(nb::module_& m);
#if MASSKV_PY_CUDA
void bind_cuda_stores(nb::module_& m);  // cuda_stores.cpp: cuda_append, cuda_summarize_pages, cuda_check
void bind_cuda_prefill(nb::module_& m);  // cuda_prefill.cpp: cuda_prefill
#endif

// "HND" | "NHD" as kv::Layout; anything else raises masskv.Error naming "layout".
kv::Layout parse_layout(const std::string& s);
// alpha == 1 is softmax; alpha in (1, 2] is alpha-entmax (docs/design.md §2.1). Anything else
// raises masskv.Error (a ValueError) naming "alpha".
Mapping mapping_of(double alpha);
// The selector settings the Python API names (the rest keep their defaults). budget: "fixed" |
// "top_p" | "adaptive". Errors (masskv.Error) name the argument.
select::SelectorConfig selector_config(const std::string& method, double alpha,
                                       const std::string& budget, std::int64_t budget_tokens,
                                       double top_p, int sink_pages, int window_tokens);

}  // namespace masskv::py
