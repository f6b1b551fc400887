// The activation file of include/masskv/learn/activations.hpp: a record stream, so collection
// writes while the model runs and never holds a layer's data in memory.
#include <array>
#include <cstring>
#include <string>

#include "masskv/error.hpp"
#include "masskv/learn/activations.hpp"

namespace masskv::learn {
namespace {

constexpr char kMagic[8] = {'M', 'K', 'V', 'A', 'C', 'T', '0', '1'};
constexpr std::uint32_t kSequence = 'S', kKeys = 'K', kQuery = 'Q', kEnd = 'E';
constexpr std::size_t kHeaderWords = 12;

std::array<std::uint32_t, kHeaderWords> header_words(const ActivationHeader& h) {
  const auto u = [](int v) { return static_cast<std::uint32_t>(v); };
  return {h.input == Input::qk ? 0u : 1u, u(h.layer), u(h.groups), u(h.q_width), u(h.k_width),
          u(h.n_head_kv), u(h.page_size), u(h.budget_den), u(h.n_layer), u(h.n_embd), u(h.n_head),
          u(h.head_dim)};
}

void check_header(const ActivationHeader& h, std::string_view argument) {
  require(h.layer >= 0 && h.layer < h.n_layer && h.groups >= 1 && h.q_width > 0 &&
              h.k_width > 0 && h.n_head_kv >= 1 && h.page_size >= 1 && h.budget_den >= 1 &&
              h.n_embd > 0 && h.n_head > 0 && h.head_dim > 0 && h.q_width <= (1 << 20) &&
              h.k_width <= (1 << 20) && h.groups <= h.n_head_kv,
          ErrorCode::invalid_argument, argument, "inconsistent activation header (layer ",
          h.layer, " of ", h.n_layer, ", groups ", h.groups, ", widths ", h.q_width, "/",
          h.k_width, ")");
}

// Sequential reader that turns every short read into one truncation error.
class Reader {
 public:
  explicit Reader(const std::string& path) : path_(path), f_(std::fopen(path.c_str(), "rb")) {
    require(f_ != nullptr, ErrorCode::io, "path", "cannot read ", path);
  }
  ~Reader() { std::fclose(f_); }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  void get(void* data, std::size_t bytes) {
    require(std::fread(data, 1, bytes, f_) == bytes, ErrorCode::invalid_argument, "path", path_,
            ": truncated activation file");
  }
  std::uint32_t u32() {
    std::uint32_t v = 0;
    get(&v, sizeof v);
    return v;
  }
  void floats(std::vector<float>& out, std::size_t n) {
    out.resize(n);
    get(out.data(), n * sizeof(float));
  }
  bool at_end() { return std::fgetc(f_) == EOF; }

  ActivationHeader header() {
    char magic[8] = {};
    get(magic, sizeof magic);
    require(std::memcmp(magic, kMagic, sizeof magic) == 0, ErrorCode::invalid_argument, "path",
            path_, " is not a masskv activation file");
    std::array<std::uint32_t, kHeaderWords> w{};
    get(w.data(), sizeof w);
    require(w[0] <= 1, ErrorCode::invalid_argument, "path", path_, ": input ", w[0]);
    for (const std::uint32_t v : w) {
      require(v < (1u << 30), ErrorCode::invalid_argument, "path", path_, ": header value ", v);
    }
    const auto i = [](std::uint32_t v) { return static_cast<int>(v); };
    ActivationHeader h{w[0] == 0 ? Input::qk : Input::hidden, i(w[1]), i(w[2]), i(w[3]), i(w[4]),
                       i(w[5]), i(w[6]), i(w[7]), i(w[8]), i(w[9]), i(w[10]), i(w[11])};
    check_header(h, "path");
    return h;
  }

 private:
  std::string path_;
  std::FILE* f_;
};

}  // namespace

ActivationWriter::ActivationWriter(const std::string& path, const ActivationHeader& header)
    : path_(path), header_(header) {
  check_header(header, "header");
  file_ = std::fopen(part_path().c_str(), "wb");
  require(file_ != nullptr, ErrorCode::io, "path", "cannot write ", part_path());
  put(kMagic, sizeof kMagic);
  const auto w = header_words(header);
  put(w.data(), sizeof w);
}

ActivationWriter::~ActivationWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void ActivationWriter::put(const void* data, std::size_t bytes) {
  require(file_ != nullptr, ErrorCode::invalid_argument, "path", path_, " is closed");
  require(std::fwrite(data, 1, bytes, file_) == bytes, ErrorCode::io, "path", "writing ", path_,
          " failed");
}

void ActivationWriter::begin_sequence(std::int64_t length) {
  require(length_ < 0 || keys_seen_ == length_, ErrorCode::invalid_argument, "length",
          "the previous sequence got ", keys_seen_, " of its ", length_, " key rows");
  require(length >= 1 && length < (std::int64_t{1} << 31), ErrorCode::invalid_argument, "length",
          length);
  const std::uint32_t rec[2] = {kSequence, static_cast<std::uint32_t>(length)};
  put(rec, sizeof rec);
  length_ = length;
  keys_seen_ = 0;
  last_query_ = -1;
}

void ActivationWriter::keys(std::int64_t pos0, int n, std::span<const float> rows) {
  require(length_ >= 0, ErrorCode::invalid_argument, "pos0", "keys before begin_sequence");
  require(pos0 == keys_seen_ && n >= 1 && pos0 + n <= length_, ErrorCode::invalid_argument,
          "pos0", "key rows ", pos0, "..", pos0 + n, " do not continue the ", keys_seen_,
          " rows of a sequence of ", length_);
  require(rows.size() == static_cast<std::size_t>(n) * header_.k_width,
          ErrorCode::shape_mismatch, "rows", rows.size(), " values for ", n, " rows of ",
          header_.k_width);
  const std::uint32_t rec[3] = {kKeys, static_cast<std::uint32_t>(pos0),
                                static_cast<std::uint32_t>(n)};
  put(rec, sizeof rec);
  put(rows.data(), rows.size_bytes());
  keys_seen_ += n;
}

void ActivationWriter::query(std::int64_t pos, std::span<const float> x,
                             std::span<const float> quest, std::span<const float> target) {
  require(pos >= 0 && pos < keys_seen_, ErrorCode::invalid_argument, "pos", "query at ", pos,
          " before its key row was written (", keys_seen_, " rows)");
  require(pos > last_query_, ErrorCode::invalid_argument, "pos", "query at ", pos,
          " after one at ", last_query_, " (queries of a sequence go in ascending order)");
  require(x.size() == static_cast<std::size_t>(header_.q_width), ErrorCode::shape_mismatch, "x",
          x.size(), " values, q_width is ", header_.q_width);
  require(quest.size() == static_cast<std::size_t>(header_.n_head_kv), ErrorCode::shape_mismatch,
          "quest", quest.size(), " values, n_head_kv is ", header_.n_head_kv);
  require(target.size() == static_cast<std::size_t>(header_.groups) * static_cast<std::size_t>(pos + 1),
          ErrorCode::shape_mismatch, "target", target.size(), " values, expected groups x (pos + 1)");
  const std::uint32_t rec[2] = {kQuery, static_cast<std::uint32_t>(pos)};
  put(rec, sizeof rec);
  put(x.data(), x.size_bytes());
  put(quest.data(), quest.size_bytes());
  put(target.data(), target.size_bytes());
  last_query_ = pos;
}

void ActivationWriter::close() {
  require(length_ < 0 || keys_seen_ == length_, ErrorCode::invalid_argument, "length",
          "the last sequence got ", keys_seen_, " of its ", length_, " key rows");
  put(&kEnd, sizeof kEnd);
  const bool ok = std::fclose(file_) == 0;
  file_ = nullptr;
  require(ok && std::rename(part_path().c_str(), path_.c_str()) == 0, ErrorCode::io, "path",
          "closing ", part_path(), " or renaming it to ", path_, " failed");
}

ActivationHeader read_activation_header(const std::string& path) {
  try {
    Reader r(path);
    return r.header();
  } catch (const Error& e) {
    if (e.argument() == "path") throw;
    fail(ErrorCode::invalid_argument, "path", path, ": ", e.what());
  }
}

LayerActivations read_activations(const std::string& path) {
  Reader r(path);
  LayerActivations a;
  a.header = r.header();
  const ActivationHeader& h = a.header;
  const auto bad = [&](auto... parts) { fail(ErrorCode::invalid_argument, "path", path, ": ", parts...); };
  std::int64_t seen = 0;
  for (;;) {
    const std::uint32_t tag = r.u32();
    if (tag == kEnd) break;
    if (tag == kSequence) {
      if (!a.sequences.empty() && seen != a.sequences.back().length) bad("short sequence");
      ActivationSequence s;
      s.length = r.u32();
      if (s.length < 1 || s.length >= (std::int64_t{1} << 31)) bad("sequence length ", s.length);
      s.keys.reserve(static_cast<std::size_t>(s.length) * h.k_width);
      a.sequences.push_back(std::move(s));
      seen = 0;
    } else if (tag == kKeys) {
      if (a.sequences.empty()) bad("key rows before a sequence");
      ActivationSequence& s = a.sequences.back();
      const std::int64_t pos0 = r.u32(), n = r.u32();
      if (pos0 != seen || n < 1 || pos0 + n > s.length) bad("key rows out of order");
      std::vector<float> rows;
      r.floats(rows, static_cast<std::size_t>(n) * h.k_width);
      s.keys.insert(s.keys.end(), rows.begin(), rows.end());
      seen += n;
    } else if (tag == kQuery) {
      if (a.sequences.empty()) bad("query before a sequence");
      ActivationQuery q;
      q.seq = static_cast<int>(a.sequences.size()) - 1;
      q.pos = r.u32();
      if (q.pos >= seen) bad("query at ", q.pos, " before its key row");
      if (!a.queries.empty() && a.queries.back().seq == q.seq && a.queries.back().pos >= q.pos) {
        bad("queries out of order");
      }
      r.floats(q.x, static_cast<std::size_t>(h.q_width));
      r.floats(q.quest, static_cast<std::size_t>(h.n_head_kv));
      r.floats(q.target, static_cast<std::size_t>(h.groups) * static_cast<std::size_t>(q.pos + 1));
      a.queries.push_back(std::move(q));
    } else {
      bad("unknown record tag ", tag);
    }
  }
  if (!a.sequences.empty() && seen != a.sequences.back().length) bad("short sequence");
  if (!r.at_end()) bad("bytes after the end record");
  return a;
}

std::string activation_path(const std::string& dir, int layer) {
  return dir + (layer < 10 ? "/layer0" : "/layer") + std::to_string(layer) + ".mkva";
}

}  // namespace masskv::learn
