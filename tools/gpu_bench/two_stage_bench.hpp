// masskv_gpu_bench's two-stage part (two_stage_bench.cu): the bench's "two_stage select + token
// decode" rows and profile-two-stage. The checks are tests/cuda/two_stage_check.cu.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "masskv/cuda/decode.hpp"
#include "masskv/kv/paged_kv.hpp"
#include "masskv/select/page_bound.hpp"
#include "masskv/select/selector.hpp"
#include "masskv/tensor.hpp"

// token_codes' select at the bench's shape (32K, 128K), round robin and log_prob, one pass and
// two passes (code_channels 0.5 / 0.375, code_candidates 2), timed.
int run_profile_two_stage();

// One bench shape's inputs (device memory unless said): the bf16 HND pool, its f32 summaries
// (host: uploaded once), the bound store, per-rotation tables and queries.
struct TwoStageBenchShape {
  int ctx = 0, batch = 1, hq = 32, hkv = 8, d = 128, page = 16, pool_pages = 0;
  int budget = 4096, sink_pages = 1, window_tokens = 0;
  int factor = masskv::select::SelectorConfig{}.candidate_factor;  // the library's default
  bool log_prob = false;  // factor 0: GroupRule::log_prob (rows tagged token_codes_lse)
  // factor 0: token_codes in two passes when code_channels < 1 (rows tagged ..._2p; the
  // codes' channel-major copy is made on the device once per pool).
  double code_channels = 1.0;
  int code_candidates = 2;
  const void* k = nullptr;
  const void* v = nullptr;
  const float* host_min = nullptr;  // [pool_pages][hkv][d] f32 summaries, host
  const float* host_max = nullptr;
  masskv::select::BoundStoreView store;  // device
  std::vector<masskv::kv::PageTable> tables;       // device spans, per table rotation
  std::vector<const float*> q;                     // device [batch][hq][d], per query rotation
  masskv::cuda::DecodeWorkspace* decode_ws = nullptr;
};
struct TwoStageBenchRow {
  std::string kind;
  double us, bytes;
};
// Step r: table r % tables, query r % q. Rows: the select alone (plain launches), the step
// (two-stage select + token decode) as one CUDA graph per rotation, the token decode alone on
// the step's lists (graph), and the step per layer in an 8-layer graph.
std::vector<TwoStageBenchRow> bench_two_stage(const TwoStageBenchShape& s);
