// masskv_gpu_bench's prefill benchmark (prefill_bench.cu); the check is
// tests/cuda/prefill_check.cu.
#pragma once

// Benchmark at 8K/32K/128K (B = 1, Hq 32, Hkv 8, d 128, bf16); rows to `json_path`.
int run_prefill_bench(const char* json_path);
