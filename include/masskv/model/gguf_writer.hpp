// GGUF writer (version 3, ggml's docs/gguf.md) for the small files masskv produces itself:
// distilled selectors and entmax conversions (include/masskv/learn/). Scalars, strings and f32
// tensors only: what those files need. The output reads back with GgufFile and with any GGUF
// tool (gguf-py).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace masskv::model {

class GgufWriter {
 public:
  void add_string(std::string_view key, std::string_view value);
  void add_u32(std::string_view key, std::uint32_t value);
  void add_i32(std::string_view key, std::int32_t value);
  void add_f32(std::string_view key, float value);
  void add_bool(std::string_view key, bool value);
  // dims in ggml order (dims[0] is the row width), 1 to 4 of them; product == values.size().
  // Throws Error(invalid_argument, "dims") otherwise, Error(invalid_argument, "name") on a
  // repeated tensor name.
  void add_tensor(std::string_view name, std::span<const std::uint64_t> dims,
                  std::span<const float> values);

  // The whole file (header, metadata, tensor infos, data aligned to 32 bytes).
  std::vector<std::byte> bytes() const;
  // Writes bytes() to a temporary file next to `path` and renames it over `path`, so a reader
  // never sees half a file. Throws Error(io, "path").
  void write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    std::vector<std::uint64_t> dims;
    std::vector<float> values;
  };
  std::vector<std::byte> kv_;  // encoded key/value pairs
  std::uint64_t kv_count_ = 0;
  std::vector<Tensor> tensors_;
};

}  // namespace masskv::model
