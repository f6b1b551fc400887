// The GPU checks of masskv_gpu_tests (gpu_tests.cu runs them): each compares CUDA kernels with
// the CPU (the f64 references or the CPU selectors, with the tolerances its file states), prints
// what it ran and every failure, and returns the number of failures (0: passed).
#pragma once

// Every CUDA decode kernel against the f64 reference, softmax and entmax (decode_check.cu).
int run_decode_check();
// cuda::decode over token selections vs attn::decode_reference and attn::decode
// (two_stage_check.cu).
int run_decode_token_check();
// GPU Quest selection: ties, budget edges, determinism, errors, graphs, end to end
// (select_selftest.cu).
int run_select_selftest();
// GPU Quest selection against the CPU selector on ~90 shapes (select_check.cu).
int run_select_check();
// 8-bit and hierarchical selection against their CPU references, bit for bit (compact_check.cu).
int run_compact_check();
// cuda::two_stage_select against select::run_selector, list for list (two_stage_check.cu).
int run_two_stage_check();
// cuda::prefill and cuda::prefill_index against the f64 reference (prefill_check.cu).
int run_prefill_check();
// cuda::append against the CPU cache and bound store, bit for bit (append_check.cu).
int run_append_check();
// cuda::extend_kept against select::extend_kept, list for list (extend_check.cu).
int run_extend_check();
// A test scorer's device form through the GPU hierarchical selection against its CPU form
// through select::run_selector (scorer_check.cu).
int run_scorer_check();
// cuda::engine_pages against kv::engine_pages, entry for entry (engine_pages_check.cu).
int run_engine_pages_check();
