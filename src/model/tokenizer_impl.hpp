// The two tokenizer algorithms behind Tokenizer::create (tokenizer_bpe.cpp, tokenizer_spm.cpp).
#pragma once

#include <memory>

#include "masskv/model/tokenizer.hpp"

namespace masskv::model::detail {

std::unique_ptr<Tokenizer> make_bpe_tokenizer(Vocab vocab);
std::unique_ptr<Tokenizer> make_spm_tokenizer(Vocab vocab);

}  // namespace masskv::model::detail
