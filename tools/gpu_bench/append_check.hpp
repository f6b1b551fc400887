// masskv_gpu_bench's append part (append_check.cu): cuda::append against the CPU cache and
// bound store, bit for bit, plus its error flag and its time.
#pragma once

// Grid check; returns the number of failures (printed).
int run_append_check();
