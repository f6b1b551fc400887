// What a selector reads besides the KV rows it selects (issue 30's budget accounting,
// docs/eval.md "Budgets"): the bytes a GPU implementation of the same rule reads per decode
// step and layer, counted against dense attention's f16 K+V bytes. The CPU code reads more
// (f32 summaries); the accounting is of the format a production path stores:
//   per page and kv head:  bf16 min + max (the §2.3 bound, also two_stage's code range)
//                          4 d bytes; bf16 mean + variance (page moments) 4 d bytes
//   per token and kv head: f16 key 2 d bytes (oracle); selector key row_bytes(format, d)
//                          (top_p with quant_keys); page codes d / 4 bytes (two_stage, the
//                          candidates' tokens only); learned key rows (groups x their row;
//                          learned_codes: then the codes of its candidates)
// Sinks and the recent window are KV rows (in the rows read), not selector reads.
#pragma once

#include <cstdint>
#include <span>

#include "masskv/kv/paged_kv.hpp"
#include "masskv/select/selector.hpp"

namespace masskv::select {

// Sizes a selector's reads depend on.
struct ReadShape {
  int num_kv_heads = 0, head_dim = 0, page_size = 0;
  double learned_row_bytes = 0;  // learned, learned_codes: key-row bytes per token (all groups)
};

// Selector bytes of one decode step over every sequence of `table`, for `config`.
// `code_pages`: the selection's SelectOutput::code_pages ([B][Hkv]), the pages the codes'
// second pass read (token_codes in two passes, learned_codes); empty (or -1) counts one page per
// candidate, an upper bound.
double selector_read_bytes(const SelectorConfig& config, const kv::PageTable& table,
                           const ReadShape& shape, std::span<const std::int32_t> code_pages = {});
// Bytes of one dense f16 K+V row (one token, one kv head): the unit the reads are reported in.
constexpr double dense_row_bytes(int head_dim) { return 4.0 * head_dim; }

// The budget in tokens of each selecting layer when `dense` of the `layers` that select would
// otherwise read their whole `length` tokens: (budget·layers − dense·length) / (layers − dense),
// rounded down, at least 1 (the kept tokens are then all a layer reads). `budget` 0 (no cap)
// stays 0; dense 0 returns budget.
std::int64_t budget_beside_dense_layers(std::int64_t budget, int layers, int dense,
                                        std::int64_t length);

}  // namespace masskv::select
