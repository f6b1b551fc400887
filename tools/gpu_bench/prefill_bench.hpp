// masskv_gpu_bench's prefill part (prefill_bench.cu): the check of cuda::prefill and
// cuda::prefill_index against the CPU f64 reference, and the prefill benchmark.
#pragma once

// Grid check; returns the number of failures (printed).
int run_prefill_check();
// Benchmark at 8K/32K/128K (B = 1, Hq 32, Hkv 8, d 128, bf16); rows to `json_path`.
int run_prefill_bench(const char* json_path);
