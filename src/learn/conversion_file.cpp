// The entmax conversion file (include/masskv/learn/conversion.hpp, docs/learned.md): a GGUF with
//   general.architecture              = "masskv-entmax"
//   masskv.model.architecture         = the model's general.architecture
//   masskv.model.name                 = the model's general.name ("" when it has none)
//   masskv.model.{block_count, embedding_length, head_count, head_count_kv, head_dim}  (u32)
//   masskv.entmax.alpha               (f32)
//   masskv.entmax.proxy               (string), masskv.entmax.global_scale (f32),
//   masskv.entmax.calibration_tokens  (u32), masskv.entmax.calibration_kl (f32)  [provenance]
//   tensor entmax.temperature         dims {head_count, block_count} f32 ([layer][head])
#include <cmath>
#include <cstring>
#include <string>

#include "eval/rng.hpp"
#include "masskv/error.hpp"
#include "masskv/learn/conversion.hpp"
#include "masskv/model/gguf.hpp"
#include "masskv/model/gguf_writer.hpp"

namespace masskv::learn {
namespace {

constexpr std::string_view kArch = "masskv-entmax";
constexpr std::string_view kTensor = "entmax.temperature";

std::size_t heads_total(const EntmaxConversion& c) {
  return static_cast<std::size_t>(c.n_layer) * static_cast<std::size_t>(c.n_head);
}

}  // namespace

EntmaxConversion EntmaxConversion::identity(const model::Model& model, double alpha) {
  const model::ModelConfig& cfg = model.config();
  EntmaxConversion c;
  c.alpha = alpha;
  c.architecture = model.file().get_or<std::string>("general.architecture", "");
  c.model_name = model.file().get_or<std::string>("general.name", "");
  c.n_layer = cfg.n_layer;
  c.n_embd = cfg.n_embd;
  c.n_head = cfg.n_head;
  c.n_head_kv = cfg.n_head_kv;
  c.head_dim = cfg.head_dim;
  c.temperature.assign(heads_total(c), 1.0f);
  c.proxy = "identity";
  return c;
}

void EntmaxConversion::validate() const {
  const auto bad = [](auto... parts) { fail(ErrorCode::invalid_argument, "conversion", parts...); };
  if (!(std::isfinite(alpha) && alpha > 1.0 && alpha <= 2.0)) bad("alpha ", alpha, " not in (1, 2]");
  if (n_layer <= 0 || n_embd <= 0 || n_head <= 0 || n_head_kv <= 0 || head_dim <= 0 ||
      n_head % n_head_kv != 0) {
    bad("model shape (layers ", n_layer, ", embd ", n_embd, ", heads ", n_head, "/", n_head_kv,
        ", head_dim ", head_dim, ") is not a valid GQA model");
  }
  if (temperature.size() != heads_total(*this)) {
    bad(temperature.size(), " temperatures for ", n_layer, " layers × ", n_head, " heads");
  }
  for (std::size_t i = 0; i < temperature.size(); ++i) {
    if (!(std::isfinite(temperature[i]) && temperature[i] > 0)) {
      bad("temperature ", i, " (layer ", i / static_cast<std::size_t>(n_head), ", head ",
          i % static_cast<std::size_t>(n_head), ") is ", temperature[i]);
    }
  }
}

void EntmaxConversion::check_model(const model::Model& model, std::string_view option) const {
  const model::ModelConfig& c = model.config();
  const std::string arch = model.file().get_or<std::string>("general.architecture", "");
  const std::string name = model.file().get_or<std::string>("general.name", "");
  require(arch == architecture && c.n_layer == n_layer && c.n_embd == n_embd &&
              c.n_head == n_head && c.n_head_kv == n_head_kv && c.head_dim == head_dim &&
              (model_name.empty() || name.empty() || name == model_name),
          ErrorCode::invalid_argument, option, "the conversion was fitted on ", architecture,
          " '", model_name, "' (", n_layer, " layers, embd ", n_embd, ", heads ", n_head, "/",
          n_head_kv, ", head_dim ", head_dim, "), not on this model: ", arch, " '", name, "' (",
          c.n_layer, " layers, embd ", c.n_embd, ", heads ", c.n_head, "/", c.n_head_kv,
          ", head_dim ", c.head_dim, ")");
}

void EntmaxConversion::apply(model::SessionOptions& options) const {
  options.mapping = Mapping::entmax(alpha);
  options.score_multipliers = temperature;
}

void save(const EntmaxConversion& c, const std::string& path) {
  c.validate();
  model::GgufWriter w;
  w.add_string("general.architecture", kArch);
  w.add_string("masskv.model.architecture", c.architecture);
  w.add_string("masskv.model.name", c.model_name);
  w.add_u32("masskv.model.block_count", static_cast<std::uint32_t>(c.n_layer));
  w.add_u32("masskv.model.embedding_length", static_cast<std::uint32_t>(c.n_embd));
  w.add_u32("masskv.model.head_count", static_cast<std::uint32_t>(c.n_head));
  w.add_u32("masskv.model.head_count_kv", static_cast<std::uint32_t>(c.n_head_kv));
  w.add_u32("masskv.model.head_dim", static_cast<std::uint32_t>(c.head_dim));
  w.add_f32("masskv.entmax.alpha", static_cast<float>(c.alpha));
  w.add_string("masskv.entmax.proxy", c.proxy);
  w.add_f32("masskv.entmax.global_scale", static_cast<float>(c.global_scale));
  w.add_u32("masskv.entmax.calibration_tokens", static_cast<std::uint32_t>(c.calibration_tokens));
  w.add_f32("masskv.entmax.calibration_kl", static_cast<float>(c.calibration_kl));
  const std::uint64_t dims[2] = {static_cast<std::uint64_t>(c.n_head),
                                 static_cast<std::uint64_t>(c.n_layer)};
  w.add_tensor(kTensor, dims, c.temperature);
  w.write(path);
}

EntmaxConversion load_conversion(const std::string& path) {
  try {
    const model::GgufFile f = model::GgufFile::open(path);
    require(f.get_or<std::string>("general.architecture", "") == kArch,
            ErrorCode::invalid_argument, "path", path, " is not a masskv entmax conversion file");
    EntmaxConversion c;
    c.architecture = f.get<std::string>("masskv.model.architecture");
    c.model_name = f.get_or<std::string>("masskv.model.name", "");
    c.n_layer = f.get<int>("masskv.model.block_count");
    c.n_embd = f.get<int>("masskv.model.embedding_length");
    c.n_head = f.get<int>("masskv.model.head_count");
    c.n_head_kv = f.get<int>("masskv.model.head_count_kv");
    c.head_dim = f.get<int>("masskv.model.head_dim");
    c.alpha = f.get<double>("masskv.entmax.alpha");
    c.proxy = f.get_or<std::string>("masskv.entmax.proxy", "");
    c.global_scale = f.get_or<double>("masskv.entmax.global_scale", 1.0);
    c.calibration_tokens = f.get_or<std::int64_t>("masskv.entmax.calibration_tokens", 0);
    c.calibration_kl = f.get_or<double>("masskv.entmax.calibration_kl",
                                        std::numeric_limits<double>::quiet_NaN());
    const model::GgufTensor& t = f.tensor(kTensor);
    require(t.type == model::GgmlType::f32 && t.n_dims == 2 &&
                t.dims[0] == static_cast<std::uint64_t>(c.n_head) &&
                t.dims[1] == static_cast<std::uint64_t>(c.n_layer),
            ErrorCode::invalid_argument, "path", kTensor, " is not an f32 tensor of dims {",
            c.n_head, ", ", c.n_layer, "}");
    c.temperature.resize(t.n_elements);
    std::memcpy(c.temperature.data(), t.data, t.n_elements * sizeof(float));
    c.validate();
    const std::span<const std::byte> bytes = f.bytes();
    c.file_hash = eval::fnv1a(
        std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
    return c;
  } catch (const Error& e) {
    // Every failure is the file's: report it against "path" (I/O stays io).
    if (e.argument() == "path") throw;
    fail(e.code() == ErrorCode::io ? ErrorCode::io : ErrorCode::invalid_argument, "path", path,
         ": ", e.what());
  }
}

}  // namespace masskv::learn
