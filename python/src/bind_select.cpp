// Every selector through run_selector, and the per-head diagnostics (docs/design.md §2.2–§2.5, §3).
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "cuda_calls.hpp"
#include "kv_objects.hpp"
#include "masskv/error.hpp"
#include "engine_outputs.hpp"
#include "masskv/kv/engine_pages.hpp"
#include "masskv/select/diagnostics.hpp"
#include "masskv/select/page_bound.hpp"
#include "masskv/select/selector.hpp"

namespace masskv::py {
namespace {

select::Budget::Kind parse_budget(const std::string& s) {
  using K = select::Budget::Kind;
  if (s == "fixed") return K::fixed;
  if (s == "top_p") return K::top_p;
  if (s == "adaptive") return K::adaptive;
  fail(ErrorCode::invalid_argument, "budget",
       "expected \"fixed\", \"top_p\" or \"adaptive\", got \"", s, "\"");
}

}  // namespace

select::SelectorConfig selector_config(const std::string& method, double alpha,
                                       const std::string& budget, std::int64_t budget_tokens,
                                       double top_p, int sink_pages, int window_tokens) {
  select::SelectorConfig c;
  c.method = select::parse_method(method, "method");
  c.mapping = mapping_of(alpha);
  c.budget.kind = parse_budget(budget);
  c.budget.tokens = budget_tokens;
  c.budget.p = top_p;
  c.sink_pages = sink_pages;
  c.window_tokens = window_tokens;
  return c;
}

namespace {

using select::Budget;
using select::GroupRule;
using select::MassSource;

GroupRule parse_group(const std::string& s) {
  if (s == "default") return GroupRule::method_default;
  if (s == "union") return GroupRule::union_heads;
  if (s == "aggregate") return GroupRule::aggregate;
  if (s == "log_prob") return GroupRule::log_prob;
  fail(ErrorCode::invalid_argument, "group",
       "expected \"default\", \"union\", \"aggregate\" or \"log_prob\", got \"",
       s, "\"");
}

MassSource parse_mass_source(const std::string& s) {
  if (s == "page_mean") return MassSource::page_mean;
  if (s == "page_gaussian") return MassSource::page_gaussian;
  fail(ErrorCode::invalid_argument, "mass_source",
       "expected \"page_mean\" or \"page_gaussian\", got \"", s, "\"");
}

struct SelectResult {
  nb::object selection;  // masskv.Selection
  nb::object estimate;   // float64 (B, Hq)
  nb::object certified;  // uint8 (B, Hkv)
};

SelectResult run_select(InArray q, const KV& kv, const std::string& method, double alpha,
                        const std::string& budget, std::int64_t budget_tokens, double top_p,
                        int sink_pages, int window_tokens, const std::string& group,
                        const std::string& mass_source, double tau_margin, int seed_pages,
                        bool oracle_tokens, bool oracle_head_collapsed, float scale,
                        bool bf16_bounds, double code_channels, int code_candidates,
                        bool code_channel_spread) {
  const Cache& cache = kv.require_cache("a selector");
  select::SelectorConfig cfg =
      selector_config(method, alpha, budget, budget_tokens, top_p, sink_pages, window_tokens);
  cfg.group = parse_group(group);
  cfg.mass_source = parse_mass_source(mass_source);
  cfg.tau_margin = tau_margin;
  cfg.seed_pages = seed_pages;
  cfg.oracle_tokens = oracle_tokens;
  cfg.oracle_head_collapsed = oracle_head_collapsed;
  cfg.code_channels = code_channels;
  cfg.code_candidates = code_candidates;
  cfg.code_channel_spread = code_channel_spread;

  select::SelectArgs a;
  a.q = view3_f32(q, "q");
  a.cache = kv.checked();
  a.summaries = cache.cache.summaries();
  a.page_codes = cache.cache.page_codes();  // empty unless the cache keeps them
  a.scale = scale;
  auto* owned = new Selection();
  nb::object sel_obj = nb::cast(owned, nb::rv_policy::take_ownership);
  select::SelectOutput out;
  {
    nb::gil_scoped_release nogil;
    std::optional<select::BoundStore> store;
    select::BoundStoreView store_view;
    if (bf16_bounds) {
      store.emplace(a.summaries);
      store_view = store->view();
      a.bounds_bf16 = &store_view;
    }
    select::run_selector(a, cfg, out);
  }
  owned->storage = std::move(out.selection);
  const auto B = static_cast<std::size_t>(a.q.n0), Hq = static_cast<std::size_t>(a.q.n1),
             Hkv = static_cast<std::size_t>(a.cache.num_kv_heads);
  SelectResult r;
  r.selection = sel_obj;
  r.estimate = numpy_from_vector(std::move(out.estimate), {B, Hq});
  r.certified = numpy_from_vector(std::move(out.certified), {B, Hkv});
  return r;
}

nb::dict diagnose(InArray q, const KV& kv, const Selection* selection, double alpha, float scale,
                  bool study, bool bf16_bounds) {
  const Cache& cache = kv.require_cache("diagnose");
  select::DiagnosticsArgs a;
  a.q = view3_f32(q, "q");
  a.cache = kv.checked();
  a.summaries = cache.cache.summaries();
  a.mapping = mapping_of(alpha);
  a.scale = scale;
  a.study = study;
  SelectionView sel;
  if (selection != nullptr) {
    sel = selection->view();
    a.selection = &sel;
  }
  std::vector<select::HeadDiagnostics> d;
  {
    nb::gil_scoped_release nogil;
    std::optional<select::BoundStore> store;
    select::BoundStoreView store_view;
    if (bf16_bounds) {
      store.emplace(a.summaries);
      store_view = store->view();
      a.bounds_bf16 = &store_view;
    }
    select::diagnose(a, d);
  }
  const std::vector<std::size_t> shape{static_cast<std::size_t>(a.q.n0),
                                       static_cast<std::size_t>(a.q.n1)};
  nb::dict out;
  auto column = [&](const char* name, auto field) {
    using T = std::decay_t<decltype(d[0].*field)>;
    using Stored = std::conditional_t<std::is_same_v<T, bool>, std::uint8_t, T>;
    std::vector<Stored> v;
    v.reserve(d.size());
    for (const auto& h : d) v.push_back(static_cast<Stored>(h.*field));
    nb::object arr = numpy_from_vector(std::move(v), shape);
    if constexpr (std::is_same_v<T, bool>) arr = arr.attr("astype")("bool");
    out[name] = arr;
  };
  using H = select::HeadDiagnostics;
  column("selected_tokens", &H::selected_tokens);
  column("total_tokens", &H::total_tokens);
  column("certified", &H::certified);
  column("margin", &H::margin);
  column("tau_lo", &H::tau_lo);
  column("eps", &H::eps);
  column("tau_or_lse", &H::tau_or_lse);
  column("delta_bound", &H::delta_bound);
  column("error_bound", &H::error_bound);
  column("delta", &H::delta);
  column("recall", &H::recall);
  column("abs_error", &H::abs_error);
  column("rel_error", &H::rel_error);
  column("support", &H::support);
  column("bounds_held", &H::bounds_held);
  return out;
}

kv::EngineLists parse_engine_lists(const std::string& s) {
  if (s == "per_kv_head") return kv::EngineLists::per_kv_head;
  if (s == "head_union") return kv::EngineLists::head_union;
  fail(ErrorCode::invalid_argument, "lists", "unknown grouping '", s,
       "' (per_kv_head | head_union)");
}

// masskv.engine_pages: the CPU path here, the CUDA one in cuda_calls.cpp (same arrays).
nb::dict engine_pages_py(const Selection& sel, const KV& kv, const std::string& lists_name,
                         int max_per_list, bool csr, int max_pages_per_seq, nb::handle stream,
                         bool check) {
  const kv::EngineLists lists = parse_engine_lists(lists_name);
  if (sel.device != kv.device) {
    throw nb::value_error(("selection: lists are on " + device_string(sel.device) +
                           ", the KV on " + device_string(kv.device))
                              .c_str());
  }
  require(max_per_list >= 0, ErrorCode::invalid_argument, "max_per_list", "must be >= 0, got ",
          max_per_list);
  // Default: room for any list (a union holds at most every kv head's pages).
  const SelectionView sv = sel.view();
  if (max_per_list == 0)
    max_per_list = lists == kv::EngineLists::head_union ? sv.num_kv_heads * sv.max_per_head
                                                        : sv.max_per_head;
#if MASSKV_PY_CUDA
  if (kv.device != kCpu)
    return engine_pages_cuda(sel, kv, lists, max_per_list, csr, max_pages_per_seq, stream,
                             check);
#endif
  if (max_pages_per_seq != 0 || !stream.is_none() || !check) {
    throw nb::value_error(
        "max_pages_per_seq / stream / check: CUDA only (this selection is on the CPU)");
  }
  const kv::PagedKVView view = kv.checked();
  const auto L = static_cast<std::size_t>(
      kv::engine_list_count(lists, view.table.batch(), sv.num_kv_heads));
  kv::EnginePagesOut out;
  nb::dict d = engine_outputs(L, static_cast<std::size_t>(max_per_list), csr, out,
                              [](const char*, std::vector<std::size_t> shape) {
                                std::int32_t* data = nullptr;
                                nb::object o = new_numpy<std::int32_t>(std::move(shape), &data);
                                return std::pair{o, data};
                              });
  kv::engine_pages(sv, view.table, view.page_size, lists, out);
  return d;
}

}  // namespace

void bind_select(nb::module_& m) {
  nb::class_<SelectResult>(m, "SelectResult", "Output of masskv.select.")
      .def_ro("selection", &SelectResult::selection, "masskv.Selection")
      .def_ro("estimate", &SelectResult::estimate,
              "float64 (B, Hq): tau_hat (gaussian_tau), the exact tau(S) (entmax_support), or\n"
              "the estimated selected mass (others; NaN without an estimate).")
      .def_ro("certified", &SelectResult::certified,
              "uint8 (B, H_kv): entmax_support's certificate held for every head of the group.");

  m.def("select", &run_select, nb::arg("q").noconvert(), nb::arg("kv"), nb::kw_only(),
        nb::arg("method") = "quest", nb::arg("alpha") = 1.0, nb::arg("budget") = "fixed",
        nb::arg("budget_tokens") = 0, nb::arg("top_p") = 0.9, nb::arg("sink_pages") = 1,
        nb::arg("window_tokens") = 0, nb::arg("group") = "default",
        nb::arg("mass_source") = "page_gaussian", nb::arg("tau_margin") = 0.0,
        nb::arg("seed_pages") = 4, nb::arg("oracle_tokens") = false,
        nb::arg("oracle_head_collapsed") = false, nb::arg("scale") = 0.0f,
        nb::arg("bf16_bounds") = false,
        nb::arg("code_channels") = select::SelectorConfig{}.code_channels,
        nb::arg("code_candidates") = select::SelectorConfig{}.code_candidates,
        nb::arg("code_channel_spread") = select::SelectorConfig{}.code_channel_spread,
        "Runs one selector (select::run_selector) for the decode step with queries q\n"
        "(float32 (B, Hq, d)) over kv, which must come from PagedKVCache.view (the selectors\n"
        "read its page summaries).\n\n"
        "method: dense | sink_recent | quest | top_p | entmax_support | gaussian_tau | oracle.\n"
        "alpha: the attention the selection serves (1 = softmax, (1, 2] = entmax).\n"
        "budget: fixed (ceil(budget_tokens / page_size) pages) | top_p (estimated mass >=\n"
        "top_p, capped at budget_tokens; 0 = no cap) | adaptive (the selector's own rule).\n"
        "sink_pages / window_tokens: always kept (so is the last page). group (GQA): default\n"
        "(the method's: log_prob for token_codes, union otherwise) | union | aggregate |\n"
        "log_prob. mass_source: page_gaussian | page_mean. bf16_bounds: take the page bounds from\n"
        "the outward-rounded bf16 store. code_channels / code_candidates: token_codes' two\n"
        "passes (every token on that share of the channels, then code_candidates x the budget\n"
        "on every channel; code_channels = 1: one pass). code_channel_spread: the first pass's\n"
        "channels by sum over the heads of |q_c| times the keys' spread on c (False: |q| alone).\n"
        "Returns a SelectResult.");

  m.def("diagnose", &diagnose, nb::arg("q").noconvert(), nb::arg("kv"), nb::arg("selection").none(),
        nb::kw_only(), nb::arg("alpha") = 1.0, nb::arg("scale") = 0.0f, nb::arg("study") = false,
        nb::arg("bf16_bounds") = false,
        "Per (b, q head) diagnostics of a selection (select::diagnose, docs/design.md §2.2,\n"
        "§2.5): "
        "dict of (B, Hq) arrays selected_tokens, total_tokens (int64), certified (bool),\n"
        "margin, tau_lo, eps, tau_or_lse, delta_bound, error_bound (float64); study=True also\n"
        "reads every key for delta, recall, abs_error, rel_error (NaN otherwise), support, and\n"
        "bounds_held (bool: every bound held).");

  m.def("engine_pages", &engine_pages_py, nb::arg("selection"), nb::arg("kv"), nb::kw_only(),
        nb::arg("lists") = "per_kv_head", nb::arg("max_per_list") = 0, nb::arg("csr") = true,
        nb::arg("max_pages_per_seq") = 0, nb::arg("stream").none() = nb::none(),
        nb::arg("check") = true,
        "A page selection in the shape a serving engine's paged decode kernel takes\n"
        "(kv::engine_pages / cuda::engine_pages, docs/engine.md): the lists' *physical* page\n"
        "ids of kv's page table, in sequence order. lists: per_kv_head (B * H_kv lists) or\n"
        "head_union (B lists: the union of each sequence's kv heads' lists). Returns a dict of\n"
        "int32 arrays on the selection's device (NumPy on the CPU, torch on CUDA): ids\n"
        "(lists, max_per_list) -1 padded, count (lists,), and with csr=True FlashInfer's page\n"
        "table of the selection: indptr (lists + 1,), indices (lists * max_per_list,; the\n"
        "rest -1), last_page_len (lists,). max_per_list 0: max_per_head (per_kv_head) or\n"
        "H_kv * max_per_head (head_union). CUDA: max_pages_per_seq bounds the pages a\n"
        "sequence holds (0: every page of the table); stream and check as decode's.");

#if MASSKV_PY_CUDA
  m.def("cuda_quest_select", &quest_select_cuda, nb::arg("q").noconvert(), nb::arg("kv"),
        nb::arg("bounds_min").noconvert(), nb::arg("bounds_max").noconvert(), nb::kw_only(),
        nb::arg("budget_tokens"), nb::arg("sink_pages") = 1, nb::arg("window_tokens") = 0,
        nb::arg("scale") = 0.0f, nb::arg("max_pages_per_seq") = 0,
        nb::arg("ids").none() = nb::none(), nb::arg("count").none() = nb::none(),
        nb::arg("stream").none() = nb::none(), nb::arg("check") = true,
        nb::sig("def cuda_quest_select(q: numpy.typing.ArrayLike, kv: KV, bounds_min: "
                "numpy.typing.ArrayLike, bounds_max: numpy.typing.ArrayLike, *, budget_tokens: "
                "int, sink_pages: int = 1, window_tokens: int = 0, scale: float = 0.0, "
                "max_pages_per_seq: int = 0, ids: numpy.typing.ArrayLike | None = None, count: "
                "numpy.typing.ArrayLike | None = None, stream: int | None = None, check: bool = True) "
                "-> Selection"),
        "Quest page selection on the GPU (cuda::quest_select; no host round trip): the same\n"
        "pages as select(method=\"quest\", bf16_bounds=True) on the CPU. q: float32 (B, Hq, d)\n"
        "and kv (KV.from_arrays over CUDA tensors) on one device; bounds_min / bounds_max:\n"
        "bfloat16 (pages, H_kv, d) on that device (PagedKVCache.bf16_bounds() moved there).\n"
        "ids / count: int32 outputs (B, H_kv, >= capacity) / (B, H_kv), allocated with torch\n"
        "when None. Returns a Selection over them, for decode(..., selection=...). stream and\n"
        "check as decode's.");
  m.def("cuda_hier_select", &hier_select_cuda, nb::arg("q").noconvert(), nb::arg("kv"),
        nb::arg("bounds_min").noconvert(), nb::arg("bounds_max").noconvert(),
        nb::arg("group_min").noconvert(), nb::arg("group_max").noconvert(),
        nb::arg("group_indptr").noconvert(), nb::arg("group_indices").noconvert(),
        nb::kw_only(), nb::arg("budget_tokens"), nb::arg("sink_pages") = 1,
        nb::arg("window_tokens") = 0, nb::arg("scale") = 0.0f, nb::arg("cover") = 2.0,
        nb::arg("max_pages_per_seq") = 0, nb::arg("ids").none() = nb::none(),
        nb::arg("count").none() = nb::none(), nb::arg("stream").none() = nb::none(),
        nb::arg("check") = true,
        "Hierarchical Quest on the GPU (cuda::hier_select): the group store is scanned first,\n"
        "the best groups of each (sequence, kv head) kept (enough for cover x the budget, and\n"
        "the last group), then only their pages are scored and the page top-k selects as cuda_quest_select does. group_min /\n"
        "group_max: bfloat16 (slots, H_kv, d), 16 pages a group (cuda_update_groups keeps them);\n"
        "group_indptr (B + 1,) / group_indices: int32, sequence b's group i in slot\n"
        "group_indices[group_indptr[b] + i]. Other arguments and the result as\n"
        "cuda_quest_select's.");
  m.def("cuda_update_groups", &update_groups_cuda, nb::arg("kv"),
        nb::arg("bounds_min").noconvert(), nb::arg("bounds_max").noconvert(),
        nb::arg("group_min").noconvert(), nb::arg("group_max").noconvert(),
        nb::arg("group_indptr").noconvert(), nb::arg("group_indices").noconvert(),
        nb::kw_only(), nb::arg("last_only") = false, nb::arg("max_pages_per_seq") = 0,
        nb::arg("stream").none() = nb::none(), nb::arg("check") = true,
        "The group store of cuda_hier_select recomputed on the GPU from the bf16 page store\n"
        "(cuda::update_groups: elementwise min / max over each group's 16 pages): every group\n"
        "of kv's sequences, or only each one's last group (last_only: after a decode step's\n"
        "append). stream and check as decode's.");
#endif
}

}  // namespace masskv::py
