// The selector file (include/masskv/learn/selector.hpp, docs/learned.md): a GGUF with
//   general.architecture          = "masskv-selector"
//   masskv.selector.input         = "qk" | "hidden"
//   masskv.model.architecture     = the model's general.architecture
//   masskv.model.{block_count, embedding_length, head_count, head_count_kv, head_dim}  (u32)
//   masskv.selector.layer_count   (u32)
//   per listed layer i (0-based position in the list):
//     masskv.selector.{i}.layer, .groups, .dim (u32), .rope (bool)
//     tensors blk.{layer}.sel_q.weight  dims {q_in, dim, groups}  f32
//             blk.{layer}.sel_k.weight  dims {k_in, dim, groups}  f32
#include <algorithm>
#include <cstring>
#include <string>

#include "masskv/error.hpp"
#include "masskv/learn/selector.hpp"
#include "masskv/model/gguf.hpp"
#include "masskv/model/gguf_writer.hpp"

namespace masskv::learn {
namespace {

constexpr std::string_view kArch = "masskv-selector";

std::string layer_key(std::size_t i, std::string_view field) {
  return "masskv.selector." + std::to_string(i) + "." + std::string(field);
}
std::string tensor_name(int layer, std::string_view side) {
  return "blk." + std::to_string(layer) + ".sel_" + std::string(side) + ".weight";
}

// Reads one f32 tensor of the expected shape into `out`.
void read_tensor(const model::GgufFile& f, const std::string& name, int width, int dim, int groups,
                 std::vector<float>& out) {
  const model::GgufTensor& t = f.tensor(name);
  require(t.type == model::GgmlType::f32 && t.n_dims == 3 &&
              t.dims[0] == static_cast<std::uint64_t>(width) &&
              t.dims[1] == static_cast<std::uint64_t>(dim) &&
              t.dims[2] == static_cast<std::uint64_t>(groups),
          ErrorCode::invalid_argument, "path", name, " is not an f32 tensor of dims {", width, ", ",
          dim, ", ", groups, "}");
  out.resize(t.n_elements);
  std::memcpy(out.data(), t.data, t.n_elements * sizeof(float));
}

}  // namespace

void save(const Selector& s, const std::string& path) {
  s.validate();
  model::GgufWriter w;
  w.add_string("general.architecture", kArch);
  w.add_string("masskv.selector.input", to_string(s.input));
  w.add_string("masskv.model.architecture", s.architecture);
  w.add_u32("masskv.model.block_count", static_cast<std::uint32_t>(s.n_layer));
  w.add_u32("masskv.model.embedding_length", static_cast<std::uint32_t>(s.n_embd));
  w.add_u32("masskv.model.head_count", static_cast<std::uint32_t>(s.n_head));
  w.add_u32("masskv.model.head_count_kv", static_cast<std::uint32_t>(s.n_head_kv));
  w.add_u32("masskv.model.head_dim", static_cast<std::uint32_t>(s.head_dim));
  w.add_u32("masskv.selector.layer_count", static_cast<std::uint32_t>(s.layers.size()));
  for (std::size_t i = 0; i < s.layers.size(); ++i) {
    const LayerSelector& l = s.layers[i];
    w.add_u32(layer_key(i, "layer"), static_cast<std::uint32_t>(l.layer));
    w.add_u32(layer_key(i, "groups"), static_cast<std::uint32_t>(l.groups));
    w.add_u32(layer_key(i, "dim"), static_cast<std::uint32_t>(l.dim));
    w.add_bool(layer_key(i, "rope"), l.rope);
    const auto g = static_cast<std::uint64_t>(l.groups), d = static_cast<std::uint64_t>(l.dim);
    const std::uint64_t dq[3] = {static_cast<std::uint64_t>(l.q_in), d, g};
    const std::uint64_t dk[3] = {static_cast<std::uint64_t>(l.k_in), d, g};
    w.add_tensor(tensor_name(l.layer, "q"), dq, l.wq);
    w.add_tensor(tensor_name(l.layer, "k"), dk, l.wk);
  }
  w.write(path);
}

Selector load(const std::string& path) {
  try {
    const model::GgufFile f = model::GgufFile::open(path);
    require(f.get_or<std::string>("general.architecture", "") == kArch,
            ErrorCode::invalid_argument, "path", path, " is not a masskv selector file");
    Selector s;
    const auto input = f.get<std::string>("masskv.selector.input");
    require(input == "qk" || input == "hidden", ErrorCode::invalid_argument, "path",
            "masskv.selector.input is '", input, "', not qk or hidden");
    s.input = input == "qk" ? Input::qk : Input::hidden;
    s.architecture = f.get<std::string>("masskv.model.architecture");
    s.n_layer = f.get<int>("masskv.model.block_count");
    s.n_embd = f.get<int>("masskv.model.embedding_length");
    s.n_head = f.get<int>("masskv.model.head_count");
    s.n_head_kv = f.get<int>("masskv.model.head_count_kv");
    s.head_dim = f.get<int>("masskv.model.head_dim");
    const auto count = f.get<std::uint32_t>("masskv.selector.layer_count");
    require(count <= 4096, ErrorCode::invalid_argument, "path", "layer_count ", count);
    require(s.n_head > 0 && s.n_head_kv > 0 && s.head_dim > 0 && s.n_embd > 0 &&
                s.n_head % s.n_head_kv == 0,
            ErrorCode::invalid_argument, "path", "bad model shape in the header");
    for (std::uint32_t i = 0; i < count; ++i) {
      LayerSelector l;
      l.layer = f.get<int>(layer_key(i, "layer"));
      l.groups = f.get<int>(layer_key(i, "groups"));
      l.dim = f.get<int>(layer_key(i, "dim"));
      l.rope = f.get<bool>(layer_key(i, "rope"));
      require(l.groups == 1 || l.groups == s.n_head_kv, ErrorCode::invalid_argument, "path",
              "layer ", l.layer, ": groups ", l.groups);
      require(l.dim > 0 && l.dim <= 4096, ErrorCode::invalid_argument, "path", "layer ", l.layer,
              ": dim ", l.dim);
      l.q_in = s.input == Input::qk ? s.n_head / l.groups * s.head_dim : s.n_embd;
      l.k_in = s.input == Input::qk ? s.n_head_kv / l.groups * s.head_dim : s.n_embd;
      read_tensor(f, tensor_name(l.layer, "q"), l.q_in, l.dim, l.groups, l.wq);
      read_tensor(f, tensor_name(l.layer, "k"), l.k_in, l.dim, l.groups, l.wk);
      s.layers.push_back(std::move(l));
    }
    s.validate();
    return s;
  } catch (const Error& e) {
    // Every failure is the file's: report it against "path" (I/O stays io).
    if (e.argument() == "path") throw;
    fail(e.code() == ErrorCode::io ? ErrorCode::io : ErrorCode::invalid_argument, "path", path,
         ": ", e.what());
  }
}

}  // namespace masskv::learn
