// The selector file (learn::save / learn::load over model::GgufWriter): random selectors of
// both input kinds round-trip bit-exactly; the writer's bytes parse with GgufFile to the keys
// and tensors written; malformed selectors and files are rejected with masskv::Error.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <cstring>
#include <random>

#include <unistd.h>

#include "expect_error.hpp"
#include "masskv/learn/selector.hpp"
#include "masskv/model/gguf.hpp"
#include "masskv/model/gguf_writer.hpp"

namespace fs = std::filesystem;
using masskv::ErrorCode;
using masskv::test::expect_error;
namespace learn = masskv::learn;
namespace model = masskv::model;

namespace {

learn::Selector random_selector(learn::Input input, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  learn::Selector s;
  s.input = input;
  s.architecture = "llama";
  s.n_layer = 6, s.n_embd = 40, s.n_head = 6, s.n_head_kv = 2, s.head_dim = 8;
  for (const int layer : {0, 3, 5}) {
    learn::LayerSelector l;
    l.layer = layer;
    l.groups = layer == 3 ? s.n_head_kv : 1;
    l.dim = layer == 5 ? 6 : 4;
    l.rope = input == learn::Input::hidden && layer != 0;
    l.q_in = input == learn::Input::qk ? s.n_head / l.groups * s.head_dim : s.n_embd;
    l.k_in = input == learn::Input::qk ? s.n_head_kv / l.groups * s.head_dim : s.n_embd;
    l.wq.resize(static_cast<std::size_t>(l.groups * l.dim * l.q_in));
    l.wk.resize(static_cast<std::size_t>(l.groups * l.dim * l.k_in));
    for (float& w : l.wq) w = normal(rng);
    for (float& w : l.wk) w = normal(rng);
    s.layers.push_back(std::move(l));
  }
  return s;
}

fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / ("masskv_test_" + std::to_string(::getpid()) + "_" + name);
}

}  // namespace

TEST(LearnSelectorFile, RoundTripsBothInputKinds) {
  for (const auto input : {learn::Input::qk, learn::Input::hidden}) {
    const learn::Selector s = random_selector(input, 7);
    const fs::path p = temp_path("sel.gguf");
    learn::save(s, p.string());
    const learn::Selector r = learn::load(p.string());
    fs::remove(p);
    EXPECT_EQ(r.input, s.input);
    EXPECT_EQ(r.architecture, s.architecture);
    EXPECT_EQ(r.n_layer, s.n_layer);
    EXPECT_EQ(r.n_embd, s.n_embd);
    EXPECT_EQ(r.n_head, s.n_head);
    EXPECT_EQ(r.n_head_kv, s.n_head_kv);
    EXPECT_EQ(r.head_dim, s.head_dim);
    ASSERT_EQ(r.layers.size(), s.layers.size());
    for (std::size_t i = 0; i < s.layers.size(); ++i) {
      const auto &a = s.layers[i], &b = r.layers[i];
      EXPECT_EQ(a.layer, b.layer);
      EXPECT_EQ(a.groups, b.groups);
      EXPECT_EQ(a.dim, b.dim);
      EXPECT_EQ(a.rope, b.rope);
      EXPECT_EQ(a.q_in, b.q_in);
      EXPECT_EQ(a.k_in, b.k_in);
      EXPECT_EQ(a.wq, b.wq);  // bit-exact: f32 in, f32 out
      EXPECT_EQ(a.wk, b.wk);
    }
    EXPECT_NE(r.find(3), nullptr);
    EXPECT_EQ(r.find(1), nullptr);
  }
}

TEST(LearnSelectorFile, WriterBytesParseToWhatWasWritten) {
  model::GgufWriter w;
  w.add_string("general.architecture", "test");
  w.add_u32("a.u32", 4000000000u);
  w.add_i32("a.i32", -5);
  w.add_f32("a.f32", 0.25f);
  w.add_bool("a.bool", true);
  const std::vector<float> t1 = {1, 2, 3, 4, 5, 6};
  const std::vector<float> t2 = {-1};
  const std::uint64_t d1[2] = {3, 2}, d2[1] = {1};
  w.add_tensor("t1", d1, t1);
  w.add_tensor("t2", d2, t2);
  const std::vector<std::byte> bytes = w.bytes();
  const model::GgufFile f = model::GgufFile::from_buffer(bytes);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get<std::string>("general.architecture"), "test");
  EXPECT_EQ(f.get<std::uint32_t>("a.u32"), 4000000000u);
  EXPECT_EQ(f.get<int>("a.i32"), -5);
  EXPECT_EQ(f.get<float>("a.f32"), 0.25f);
  EXPECT_TRUE(f.get<bool>("a.bool"));
  const model::GgufTensor& a = f.tensor("t1");
  EXPECT_EQ(a.dims[0], 3u);
  EXPECT_EQ(a.dims[1], 2u);
  EXPECT_EQ((a.data - bytes.data()) % 32, 0);  // aligned within the file
  EXPECT_EQ(std::memcmp(a.data, t1.data(), sizeof(float) * t1.size()), 0);
  EXPECT_EQ(*reinterpret_cast<const float*>(f.tensor("t2").data), -1.0f);

  expect_error([&] { w.add_tensor("t1", d2, t2); }, ErrorCode::invalid_argument, "name");
  expect_error([&] { w.add_tensor("t3", d1, t2); }, ErrorCode::invalid_argument, "dims");
}

TEST(LearnSelectorFile, RejectsBadSelectorsAndFiles) {
  learn::Selector s = random_selector(learn::Input::qk, 3);
  const fs::path p = temp_path("bad.gguf");
  {
    learn::Selector b = s;
    b.layers[1].wq.pop_back();
    expect_error([&] { learn::save(b, p.string()); }, ErrorCode::invalid_argument, "selector");
  }
  {
    learn::Selector b = s;
    b.layers[1].groups = 3;  // neither 1 nor n_head_kv
    expect_error([&] { learn::save(b, p.string()); }, ErrorCode::invalid_argument, "selector");
  }
  {
    learn::Selector b = s;
    std::swap(b.layers[0], b.layers[1]);
    expect_error([&] { learn::save(b, p.string()); }, ErrorCode::invalid_argument, "selector");
  }
  {
    learn::Selector b = s;
    b.layers[0].rope = true;  // rope is for hidden input
    expect_error([&] { learn::save(b, p.string()); }, ErrorCode::invalid_argument, "selector");
  }
  // A GGUF that is not a selector.
  model::GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.write(p.string());
  expect_error([&] { (void)learn::load(p.string()); }, ErrorCode::invalid_argument, "path",
               "not a masskv selector");
  // A selector file cut short.
  learn::save(s, p.string());
  const auto size = fs::file_size(p);
  fs::resize_file(p, size - 8);
  try {
    (void)learn::load(p.string());
    ADD_FAILURE() << "truncated file accepted";
  } catch (const masskv::Error& e) {
    EXPECT_EQ(e.argument(), "path") << e.what();
  }
  fs::remove(p);
  expect_error([&] { (void)learn::load(p.string()); }, ErrorCode::io, "path");
}
