// Softmax decode over a token selection (SelectionView::Unit::token; decode_tokens.cu), entered
// from cuda::decode once the arguments are checked and `p` holds what every path shares.
#pragma once

#include "decode_common.cuh"

namespace masskv::cuda::decode_impl {

// p.sel_ids / sel_count / sel_max: the token lists (ascending logical token ids; a token id x
// reads page x / page_size, slot x % page_size through the page table). units_max: the lists'
// max_per_head. Launches the gather chunk kernel and, for more than one chunk, its merge.
void launch_softmax_tokens(Params p, DType dtype, int d, int batch, int units_max, float scale,
                           const DecodeLaunch& launch, DecodeWorkspace::Impl& ws);

}  // namespace masskv::cuda::decode_impl
