// GGUF reader (ggml's docs/gguf.md, versions 3 and 2): header, metadata key/values, tensor
// infos and the aligned data section, all bounds-checked. A malformed file yields
// masskv::Error(io) whose argument names the part that is wrong ("gguf.header",
// "gguf.kv[3].value", "gguf.tensor[blk.0.attn_q.weight]"); it never crashes or misreads.
//
// Views returned (strings, tensor data) point into the file's bytes and live as long as the
// GgufFile (moving it keeps them valid).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "masskv/error.hpp"
#include "masskv/model/quant.hpp"

namespace masskv::model {

enum class GgufType : std::uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};
std::string_view to_string(GgufType type) noexcept;

// One metadata value. Scalars are decoded; arrays keep their element type and count, with
// numeric elements left in the file (read on request), strings as views and nested arrays
// as values.
class GgufValue {
 public:
  GgufType type() const noexcept { return type_; }

  // Typed access; throws Error(invalid_argument, argument) on a type mismatch. Integers convert
  // between widths only when the value fits; floats accept f32 and f64; std::string and
  // std::string_view accept strings.
  template <class T>
  T as(std::string_view argument = "gguf.value") const;

  // Arrays (throw Error(invalid_argument) when this is not an array of the asked kind).
  GgufType array_type(std::string_view argument = "gguf.value") const;
  std::uint64_t array_size(std::string_view argument = "gguf.value") const;
  // Numeric or bool elements converted like as<T>() (checked per element).
  template <class T>
  std::vector<T> as_array(std::string_view argument = "gguf.value") const;
  const std::vector<std::string_view>& strings(std::string_view argument = "gguf.value") const;
  const std::vector<GgufValue>& arrays(std::string_view argument = "gguf.value") const;

 private:
  friend class GgufParser;
  struct IntValue {
    bool negative;
    std::uint64_t bits;  // the value (two's complement when negative)
  };
  IntValue as_integer(std::string_view argument) const;
  double as_float(std::string_view argument) const;
  // Element i of a numeric array as a scalar value of array_type_.
  GgufValue element(std::uint64_t i) const;

  GgufType type_ = GgufType::u8;
  std::uint64_t bits_ = 0;  // integers (two's complement), bool, and float/double bit patterns
  std::string_view str_;
  GgufType array_type_ = GgufType::u8;
  std::uint64_t array_size_ = 0;
  const std::byte* array_data_ = nullptr;  // numeric elements, little-endian, unaligned
  std::vector<std::string_view> strings_;
  std::vector<GgufValue> arrays_;
};

struct GgufKeyValue {
  std::string_view key;
  GgufValue value;
};

struct GgufTensor {
  std::string_view name;
  GgmlType type;
  std::uint32_t n_dims;
  std::array<std::uint64_t, 4> dims;  // ggml order: dims[0] is the row width; unused dims are 1
  std::uint64_t n_elements;
  std::uint64_t offset;  // from the start of the data section
  const std::byte* data;
  std::uint64_t bytes;

  std::uint64_t row_width() const noexcept { return dims[0]; }
  std::uint64_t rows() const noexcept { return n_elements / dims[0]; }
};

class GgufFile {
 public:
  // Maps the file read-only (throws Error(io, "path") if it cannot).
  static GgufFile open(const std::string& path);
  // Parses bytes the caller keeps alive for the lifetime of the result (fuzzer, tests).
  static GgufFile from_buffer(std::span<const std::byte> bytes);

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();

  std::uint32_t version() const noexcept { return version_; }
  std::uint64_t alignment() const noexcept { return alignment_; }
  std::uint64_t data_offset() const noexcept { return data_offset_; }
  std::span<const std::byte> bytes() const noexcept { return bytes_; }

  std::span<const GgufKeyValue> metadata() const noexcept { return kv_; }
  const GgufValue* find(std::string_view key) const noexcept;
  // Throws Error(out_of_range, key) when absent.
  const GgufValue& at(std::string_view key) const;
  template <class T>
  T get(std::string_view key) const {
    return at(key).as<T>(key);
  }
  template <class T>
  T get_or(std::string_view key, T fallback) const {
    const GgufValue* v = find(key);
    return v != nullptr ? v->as<T>(key) : fallback;
  }
  template <class T>
  std::vector<T> get_array(std::string_view key) const {
    return at(key).as_array<T>(key);
  }

  std::span<const GgufTensor> tensors() const noexcept { return tensors_; }
  const GgufTensor* find_tensor(std::string_view name) const noexcept;
  // Throws Error(out_of_range, name) when absent.
  const GgufTensor& tensor(std::string_view name) const;

 private:
  friend class GgufParser;
  struct Mapping;
  GgufFile();

  std::unique_ptr<Mapping> mapping_;  // owns the bytes when opened from a path
  std::span<const std::byte> bytes_;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;  // ggml's docs/gguf.md default if no general.alignment
  std::uint64_t data_offset_ = 0;
  std::vector<GgufKeyValue> kv_;
  std::vector<GgufTensor> tensors_;
  std::unordered_map<std::string_view, std::size_t> kv_index_;
  std::unordered_map<std::string_view, std::size_t> tensor_index_;
};

// ---- template definitions --------------------------------------------------------------

template <class T>
T GgufValue::as(std::string_view argument) const {
  if constexpr (std::is_same_v<T, bool>) {
    require(type_ == GgufType::boolean, ErrorCode::invalid_argument, argument, "is ",
            to_string(type_), ", not bool");
    return bits_ != 0;
  } else if constexpr (std::is_same_v<T, std::string_view> || std::is_same_v<T, std::string>) {
    require(type_ == GgufType::string, ErrorCode::invalid_argument, argument, "is ",
            to_string(type_), ", not string");
    return T(str_);
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(as_float(argument));
  } else {
    static_assert(std::is_integral_v<T> && sizeof(T) <= 8, "unsupported GGUF value type");
    const IntValue v = as_integer(argument);
    if (v.negative) {
      const auto s = static_cast<std::int64_t>(v.bits);
      if constexpr (std::is_signed_v<T>) {
        if (s >= static_cast<std::int64_t>(std::numeric_limits<T>::min())) return static_cast<T>(s);
      }
    } else if (v.bits <= static_cast<std::uint64_t>(std::numeric_limits<T>::max())) {
      return static_cast<T>(v.bits);
    }
    fail(ErrorCode::invalid_argument, argument, "value does not fit the requested integer type");
  }
}

template <class T>
std::vector<T> GgufValue::as_array(std::string_view argument) const {
  const std::uint64_t n = array_size(argument);
  if constexpr (std::is_same_v<T, std::string_view> || std::is_same_v<T, std::string>) {
    const auto& s = strings(argument);
    return std::vector<T>(s.begin(), s.end());
  } else {
    std::vector<T> out;
    out.reserve(n);
    for (std::uint64_t i = 0; i < n; ++i) out.push_back(element(i).as<T>(argument));
    return out;
  }
}

}  // namespace masskv::model
