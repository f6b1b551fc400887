#include "masskv/model/gguf_writer.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>

#include "masskv/error.hpp"
#include "masskv/model/gguf.hpp"
#include "masskv/model/quant.hpp"

namespace masskv::model {
namespace {

constexpr std::uint64_t kAlignment = 32;  // ggml's docs/gguf.md default (no alignment key)

// GGUF is little-endian; so is every platform masskv builds for.
void put_bytes(std::vector<std::byte>& out, const void* data, std::size_t n) {
  const std::size_t at = out.size();
  out.resize(at + n);
  if (n > 0) std::memcpy(out.data() + at, data, n);
}

template <class T>
void put(std::vector<std::byte>& out, T value) {
  put_bytes(out, &value, sizeof(T));
}

void put_string(std::vector<std::byte>& out, std::string_view s) {
  put<std::uint64_t>(out, s.size());
  put_bytes(out, s.data(), s.size());
}

template <class T>
void add_scalar(std::vector<std::byte>& kv, std::uint64_t& count, std::string_view key,
                GgufType type, T value) {
  put_string(kv, key);
  put<std::uint32_t>(kv, static_cast<std::uint32_t>(type));
  put<T>(kv, value);
  ++count;
}

std::uint64_t align_up(std::uint64_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

}  // namespace

void GgufWriter::add_string(std::string_view key, std::string_view value) {
  put_string(kv_, key);
  put<std::uint32_t>(kv_, static_cast<std::uint32_t>(GgufType::string));
  put_string(kv_, value);
  ++kv_count_;
}
void GgufWriter::add_u32(std::string_view key, std::uint32_t value) {
  add_scalar(kv_, kv_count_, key, GgufType::u32, value);
}
void GgufWriter::add_i32(std::string_view key, std::int32_t value) {
  add_scalar(kv_, kv_count_, key, GgufType::i32, value);
}
void GgufWriter::add_f32(std::string_view key, float value) {
  add_scalar(kv_, kv_count_, key, GgufType::f32, value);
}
void GgufWriter::add_bool(std::string_view key, bool value) {
  add_scalar(kv_, kv_count_, key, GgufType::boolean, static_cast<std::uint8_t>(value ? 1 : 0));
}

void GgufWriter::add_tensor(std::string_view name, std::span<const std::uint64_t> dims,
                            std::span<const float> values) {
  require(!dims.empty() && dims.size() <= 4, ErrorCode::invalid_argument, "dims",
          "a tensor has 1 to 4 dims, got ", dims.size());
  std::uint64_t n = 1;
  for (const std::uint64_t d : dims) {
    require(d > 0, ErrorCode::invalid_argument, "dims", "zero-sized dimension in ", name);
    n *= d;
  }
  require(n == values.size(), ErrorCode::invalid_argument, "dims", name, ": dims hold ", n,
          " values, got ", values.size());
  for (const Tensor& t : tensors_) {
    require(t.name != name, ErrorCode::invalid_argument, "name", "tensor ", name, " added twice");
  }
  tensors_.push_back({std::string(name), {dims.begin(), dims.end()}, {values.begin(), values.end()}});
}

std::vector<std::byte> GgufWriter::bytes() const {
  std::vector<std::byte> out;
  put_bytes(out, "GGUF", 4);
  put<std::uint32_t>(out, 3);
  put<std::uint64_t>(out, tensors_.size());
  put<std::uint64_t>(out, kv_count_);
  out.insert(out.end(), kv_.begin(), kv_.end());
  std::uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    put_string(out, t.name);
    put<std::uint32_t>(out, static_cast<std::uint32_t>(t.dims.size()));
    for (const std::uint64_t d : t.dims) put<std::uint64_t>(out, d);
    put<std::uint32_t>(out, static_cast<std::uint32_t>(GgmlType::f32));
    put<std::uint64_t>(out, offset);
    offset = align_up(offset + t.values.size() * sizeof(float));
  }
  out.resize(align_up(out.size()));
  for (const Tensor& t : tensors_) {
    put_bytes(out, t.values.data(), t.values.size() * sizeof(float));
    out.resize(align_up(out.size()));
  }
  return out;
}

void GgufWriter::write(const std::string& path) const {
  const std::vector<std::byte> data = bytes();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    require(static_cast<bool>(f), ErrorCode::io, "path", "cannot write ", tmp);
    f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
    require(static_cast<bool>(f), ErrorCode::io, "path", "write failed: ", tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  require(!ec, ErrorCode::io, "path", "cannot rename ", tmp, " to ", path, ": ", ec.message());
}

}  // namespace masskv::model
