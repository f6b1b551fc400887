// masskv_gpu_bench's modes that live in their own files (gpu_bench.cu's main dispatches): each
// returns its exit status.
#pragma once

// bench OUT.json (decode_bench.cu): 0, or 2 when the file cannot be written.
int run_bench(const char* json_path);
// profile, profile-gauss, profile-select / profile-hier [N] (profiles.cu).
int run_profile();
int run_profile_gauss();
int run_profile_select(int hier_only = 0);

// The entmax rows' alpha (the bench's and profile-gauss's).
constexpr double kBenchAlpha = 1.5;
