// ModelConfig from GGUF metadata and the weight tables of Model (model.hpp).
#include <cmath>
#include <cstdint>
#include <string>

#include "masskv/error.hpp"
#include "masskv/model/model.hpp"

namespace masskv::model {

std::string_view to_string(Arch arch) noexcept {
  switch (arch) {
    case Arch::llama:
      return "llama";
    case Arch::gemma3:
      return "gemma3";
  }
  return "?";
}

namespace {

int positive_int(const GgufFile& file, const std::string& key) {
  const auto v = file.get<std::int64_t>(key);
  require(v > 0 && v < (std::int64_t{1} << 30), ErrorCode::invalid_argument, key,
          "must be positive, got ", v);
  return static_cast<int>(v);
}

int positive_int_or(const GgufFile& file, const std::string& key, int fallback) {
  return file.find(key) != nullptr ? positive_int(file, key) : fallback;
}

// Gemma 3's layer pattern: five sliding-window layers, then one global (llama.cpp's
// set_swa_pattern(6), HF's layer_types / sliding_window_pattern = 6).
constexpr int gemma3_swa_period = 6;

}  // namespace

ModelConfig ModelConfig::from_gguf(const GgufFile& file) {
  const auto arch_name = file.get<std::string>("general.architecture");
  ModelConfig c;
  if (arch_name == "llama") {
    c.arch = Arch::llama;
  } else if (arch_name == "gemma3") {
    c.arch = Arch::gemma3;
  } else {
    fail(ErrorCode::unsupported, "general.architecture", "'", arch_name,
         "' is not supported (llama, gemma3)");
  }
  const std::string p = arch_name + ".";
  c.n_layer = positive_int(file, p + "block_count");
  c.n_embd = positive_int(file, p + "embedding_length");
  c.n_head = positive_int(file, p + "attention.head_count");
  c.n_head_kv = positive_int_or(file, p + "attention.head_count_kv", c.n_head);
  require(c.n_head % c.n_head_kv == 0, ErrorCode::invalid_argument, p + "attention.head_count_kv",
          "head_count ", c.n_head, " is not a multiple of head_count_kv ", c.n_head_kv);
  require(c.n_embd % c.n_head == 0 || file.find(p + "attention.key_length") != nullptr,
          ErrorCode::invalid_argument, p + "attention.head_count",
          "does not divide embedding_length and no key_length is given");
  c.head_dim = positive_int_or(file, p + "attention.key_length", c.n_embd / c.n_head);
  const int value_dim = positive_int_or(file, p + "attention.value_length", c.head_dim);
  require(value_dim == c.head_dim, ErrorCode::unsupported, p + "attention.value_length",
          "differs from key_length (", value_dim, " vs ", c.head_dim, ")");
  c.n_ff = positive_int(file, p + "feed_forward_length");
  c.n_ctx_train = positive_int(file, p + "context_length");
  c.rms_eps = file.get<float>(p + "attention.layer_norm_rms_epsilon");
  require(c.rms_eps > 0 && std::isfinite(c.rms_eps), ErrorCode::invalid_argument,
          p + "attention.layer_norm_rms_epsilon", "must be positive");
  c.rope_dims = positive_int_or(file, p + "rope.dimension_count", c.head_dim);
  require(c.rope_dims <= c.head_dim && c.rope_dims % 2 == 0, ErrorCode::invalid_argument,
          p + "rope.dimension_count", "must be even and <= head_dim");
  c.rope_base = file.get_or<double>(p + "rope.freq_base", 10000.0);
  require(c.rope_base > 1, ErrorCode::invalid_argument, p + "rope.freq_base", "must be > 1");
  const double factor = file.get_or<double>(p + "rope.scaling.factor", 1.0);
  const std::string scaling_type =
      file.get_or<std::string>(p + "rope.scaling.type", factor != 1.0 ? "linear" : "none");
  require(scaling_type == "none" || scaling_type == "linear", ErrorCode::unsupported,
          p + "rope.scaling.type", "'", scaling_type, "' (only linear scaling is implemented)");
  require(factor > 0, ErrorCode::invalid_argument, p + "rope.scaling.factor", "must be > 0");
  c.rope_freq_scale = 1.0 / factor;
  c.is_local.assign(static_cast<std::size_t>(c.n_layer), 0);
  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  if (c.arch == Arch::gemma3) {
    c.rope_neox = true;
    c.qk_norm = true;
    c.post_norms = true;
    c.gelu_ffn = true;
    c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
    c.sliding_window = positive_int(file, p + "attention.sliding_window");
    c.rope_base_local = file.get_or<double>(p + "rope.freq_base_swa", 10000.0);
    for (int i = 0; i < c.n_layer; ++i) {
      c.is_local[static_cast<std::size_t>(i)] = (i % gemma3_swa_period) < gemma3_swa_period - 1;
    }
    // Gemma's query_pre_attn_scalar: the 270M..12B models use head_dim (llama.cpp hardcodes
    // that); a file that records it wins.
    const double qpas = file.get_or<double>(p + "attention.query_pre_attn_scalar", c.head_dim);
    require(qpas > 0, ErrorCode::invalid_argument, p + "attention.query_pre_attn_scalar",
            "must be > 0");
    c.attn_scale = static_cast<float>(1.0 / std::sqrt(qpas));
    c.final_softcap = file.get_or<float>(p + "final_logit_softcapping", 0.0f);
  } else {
    c.rope_base_local = c.rope_base;
  }
  return c;
}

namespace {

// The tensor `name` with ggml dims {d0, d1} (d1 = 1 for vectors), typed for compute.
const GgufTensor& checked_tensor(const GgufFile& file, const std::string& name, std::uint64_t d0,
                                 std::uint64_t d1) {
  const GgufTensor& t = file.tensor(name);
  require(t.dims[0] == d0 && t.rows() == d1, ErrorCode::invalid_argument, name, "has shape [",
          t.dims[0], ", ", t.rows(), "], expected [", d0, ", ", d1, "]");
  require(type_traits(t.type).compute, ErrorCode::unsupported, name, "type ", to_string(t.type),
          " has no compute kernels");
  row_bytes(t.type, static_cast<std::size_t>(d0), name);
  return t;
}

}  // namespace

Model::Model(GgufFile file, std::string path) : file_(std::move(file)), path_(std::move(path)) {}

std::unique_ptr<Model> Model::load(const std::string& path) {
  std::unique_ptr<Model> m(new Model(GgufFile::open(path), path));
  const GgufFile& f = m->file_;
  m->config_ = ModelConfig::from_gguf(f);
  ModelConfig& c = m->config_;
  m->tokenizer_ = Tokenizer::from_gguf(f);
  c.n_vocab = static_cast<int>(m->tokenizer_->vocab_size());

  const auto E = static_cast<std::uint64_t>(c.n_embd);
  const auto V = static_cast<std::uint64_t>(c.n_vocab);
  const auto Dq = static_cast<std::uint64_t>(c.n_head) * c.head_dim;
  const auto Dkv = static_cast<std::uint64_t>(c.n_head_kv) * c.head_dim;
  const auto F = static_cast<std::uint64_t>(c.n_ff);
  const auto D = static_cast<std::uint64_t>(c.head_dim);

  m->token_embd_ = &checked_tensor(f, "token_embd.weight", E, V);
  m->output_norm_ = &checked_tensor(f, "output_norm.weight", E, 1);
  m->output_ = f.find_tensor("output.weight") != nullptr ? &checked_tensor(f, "output.weight", E, V)
                                                         : m->token_embd_;
  double bytes = static_cast<double>(m->output_->bytes) +
                 static_cast<double>(m->token_embd_->bytes) / static_cast<double>(V);
  m->layers_.resize(static_cast<std::size_t>(c.n_layer));
  for (int i = 0; i < c.n_layer; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    LayerWeights& L = m->layers_[static_cast<std::size_t>(i)];
    L.attn_norm = &checked_tensor(f, b + "attn_norm.weight", E, 1);
    L.wq = &checked_tensor(f, b + "attn_q.weight", E, Dq);
    L.wk = &checked_tensor(f, b + "attn_k.weight", E, Dkv);
    L.wv = &checked_tensor(f, b + "attn_v.weight", E, Dkv);
    L.wo = &checked_tensor(f, b + "attn_output.weight", Dq, E);
    L.ffn_norm = &checked_tensor(f, b + "ffn_norm.weight", E, 1);
    L.ffn_gate = &checked_tensor(f, b + "ffn_gate.weight", E, F);
    L.ffn_up = &checked_tensor(f, b + "ffn_up.weight", E, F);
    L.ffn_down = &checked_tensor(f, b + "ffn_down.weight", F, E);
    if (c.qk_norm) {
      L.q_norm = &checked_tensor(f, b + "attn_q_norm.weight", D, 1);
      L.k_norm = &checked_tensor(f, b + "attn_k_norm.weight", D, 1);
    }
    if (c.post_norms) {
      L.post_attn_norm = &checked_tensor(f, b + "post_attention_norm.weight", E, 1);
      L.post_ffn_norm = &checked_tensor(f, b + "post_ffw_norm.weight", E, 1);
    }
    for (const GgufTensor* t : {L.wq, L.wk, L.wv, L.wo, L.ffn_gate, L.ffn_up, L.ffn_down}) {
      bytes += static_cast<double>(t->bytes);
    }
    for (const GgufTensor* t :
         {L.attn_norm, L.ffn_norm, L.q_norm, L.k_norm, L.post_attn_norm, L.post_ffn_norm}) {
      if (t != nullptr) m->keep_norm(*t);
    }
  }
  m->keep_norm(*m->output_norm_);
  m->weight_bytes_per_token_ = bytes;
  return m;
}

namespace {
// A GGUF may declare an alignment below 4 bytes, so f32 data is read in place only when it is
// float-aligned; anything else is converted once at load.
bool readable_in_place(const GgufTensor& t) {
  return t.type == GgmlType::f32 &&
         reinterpret_cast<std::uintptr_t>(t.data) % alignof(float) == 0;
}
}  // namespace

void Model::keep_norm(const GgufTensor& t) {
  if (readable_in_place(t)) return;
  std::vector<float> w(static_cast<std::size_t>(t.n_elements));
  dequantize_row(t.type, t.data, w.data(), w.size());
  dequantised_norms_.emplace_back(&t, std::move(w));
}

const float* Model::norm_weights(const GgufTensor& t) const {
  if (readable_in_place(t)) return reinterpret_cast<const float*>(t.data);
  for (const auto& [tensor, w] : dequantised_norms_) {
    if (tensor == &t) return w.data();
  }
  fail(ErrorCode::invalid_argument, t.name, "is not a norm weight of this model");
}

}  // namespace masskv::model
