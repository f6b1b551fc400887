// masskv_gpu_bench's extend_kept part (extend_check.cu): cuda::extend_kept against
// select::extend_kept, list for list, over a grid of shapes, its error flag, and its time.
#pragma once

// Grid check; returns the number of failures (printed).
int run_extend_check();
