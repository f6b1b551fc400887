// masskv_gpu_bench's modes that live in their own files (gpu_bench.cu's main dispatches): each
// returns its exit status or failure count, as main's comment says.
#pragma once

// check / decode-check: every CUDA decode kernel against the f64 reference (decode_check.cu);
// 0 when all passed, else 1.
int run_check();
// select-check: GPU Quest selection against the CPU selector (select_check.cu); failures.
int run_select_check();
// select-compact-check: 8-bit and hierarchical selection against their CPU references, bit for
// bit (compact_check.cu); failures.
int run_compact_check();
// select-selftest: ties, budget edges, determinism, errors, graphs, end to end
// (select_selftest.cu); failures.
int run_select_selftest();
// bench OUT.json (decode_bench.cu): 0, or 2 when the file cannot be written.
int run_bench(const char* json_path);
// profile, profile-gauss, profile-select / profile-hier [N] (profiles.cu).
int run_profile();
int run_profile_gauss();
int run_profile_select(int hier_only = 0);

// The entmax rows' alpha (the bench's and profile-gauss's).
constexpr double kBenchAlpha = 1.5;
