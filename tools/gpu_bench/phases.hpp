// masskv_gpu_bench's profile-phases mode (phases.cu): the timeline of a sparse decode step's
// kernels from their phase stamps (masskv/cuda/stamps.hpp).
#pragma once

// Prints, for contexts 8K/128K/1M (B = 1, Hq 32, Hkv 8, d 128, 4096-token budget), each
// kernel's phases in the step (decode alone, flat Quest, hierarchical separate and fused).
int run_profile_phases();
