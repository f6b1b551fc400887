// libFuzzer target for the GGUF reader: any input must either parse or throw masskv::Error;
// whatever parses is walked (every metadata value, one row of every computable tensor) so
// ASan/UBSan see every view the reader hands out. Build and run: scripts/fuzz.sh [seconds].
// Keep this TU (and what it includes) free of <ranges>: Debian's clang 14 cannot compile
// libstdc++ 12's.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "masskv/error.hpp"
#include "masskv/model/gguf.hpp"
#include "masskv/model/quant.hpp"

namespace {

using masskv::model::GgufType;
using masskv::model::GgufValue;

void walk(const GgufValue& v) {
  if (v.type() == GgufType::string) {
    (void)v.as<std::string_view>();
    return;
  }
  if (v.type() != GgufType::array) {
    try {
      (void)v.as<double>();
    } catch (const masskv::Error&) {  // integers and bools are not floats
    }
    return;
  }
  switch (v.array_type()) {
    case GgufType::string:
      for (std::string_view s : v.strings()) (void)s.size();
      break;
    case GgufType::array:
      for (const GgufValue& inner : v.arrays()) walk(inner);
      break;
    case GgufType::f32:
    case GgufType::f64:
      (void)v.as_array<double>();
      break;
    case GgufType::boolean:
      (void)v.as_array<bool>();
      break;
    default:
      try {
        (void)v.as_array<std::int64_t>();
      } catch (const masskv::Error&) {  // u64 values above INT64_MAX
      }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace masskv::model;
  try {
    const GgufFile f = GgufFile::from_buffer({reinterpret_cast<const std::byte*>(data), size});
    for (const GgufKeyValue& kv : f.metadata()) walk(kv.value);
    for (const GgufTensor& t : f.tensors()) {
      if (!type_traits(t.type).compute || t.row_width() > (1u << 16)) continue;
      const std::size_t n = t.row_width();
      std::vector<float> row(n), x(n, 1.0f);
      dequantize_row(t.type, t.data, row.data(), n);
      (void)dot_row(t.type, t.data, x.data(), n);
      if (t.rows() <= 64) {
        std::vector<float> y(t.rows());
        matvec(t.type, t.data, t.rows(), n, x.data(), y.data());
      }
    }
  } catch (const masskv::Error&) {
  }
  return 0;
}
