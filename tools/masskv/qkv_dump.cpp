#include "qkv_dump.hpp"

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "masskv/error.hpp"

namespace masskv::cli {
namespace {

constexpr char kMagic[8] = {'M', 'K', 'V', 'D', 'U', 'M', 'P', '1'};

std::size_t count(std::int64_t a, int b, int c) {
  return static_cast<std::size_t>(a) * static_cast<std::size_t>(b) * static_cast<std::size_t>(c);
}

void write_floats(std::ofstream& f, const std::vector<float>& x) {
  f.write(reinterpret_cast<const char*>(x.data()),
          static_cast<std::streamsize>(x.size() * sizeof(float)));
}

void read_floats(std::ifstream& f, std::vector<float>& x, std::size_t n, const std::string& path) {
  x.resize(n);
  f.read(reinterpret_cast<char*>(x.data()), static_cast<std::streamsize>(n * sizeof(float)));
  require(f.gcount() == static_cast<std::streamsize>(n * sizeof(float)), ErrorCode::io, "dump",
          path, ": truncated (arrays shorter than the header says)");
}

QkvDump parse_header(std::ifstream& f, const std::string& path) {
  require(f.good(), ErrorCode::io, "dump", "cannot read ", path);
  char magic[8] = {};
  std::uint64_t len = 0;
  f.read(magic, 8);
  f.read(reinterpret_cast<char*>(&len), 8);
  require(f.good() && std::memcmp(magic, kMagic, 8) == 0, ErrorCode::invalid_argument, "dump", path,
          ": not a masskv q/k/v dump (written by `masskv dump`)");
  require(len > 0 && len < (1u << 20), ErrorCode::invalid_argument, "dump", path,
          ": header length ", len, " out of range");
  std::string text(len, '\0');
  f.read(text.data(), static_cast<std::streamsize>(len));
  require(f.good(), ErrorCode::io, "dump", path, ": truncated header");
  const auto j = nlohmann::json::parse(text, nullptr, false);
  require(!j.is_discarded() && j.is_object(), ErrorCode::invalid_argument, "dump", path,
          ": header is not JSON");
  QkvDump d;
  try {
    d.model = j.at("model").get<std::string>();
    d.arch = j.at("arch").get<std::string>();
    d.layer = j.at("layer").get<int>();
    d.context = j.at("context").get<std::int64_t>();
    d.steps = j.at("steps").get<int>();
    d.hq = j.at("hq").get<int>();
    d.hkv = j.at("hkv").get<int>();
    d.head_dim = j.at("head_dim").get<int>();
    d.positions = j.at("positions").get<std::vector<std::int64_t>>();
    d.q_multiplier = j.value("q_multiplier", 0.0);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::invalid_argument, "dump", path + ": header: " + e.what());
  }
  require(d.context > 0 && d.steps > 0 && d.hkv > 0 && d.hq % d.hkv == 0 && d.head_dim > 0 &&
              d.positions.size() == static_cast<std::size_t>(d.steps),
          ErrorCode::invalid_argument, "dump", path, ": inconsistent sizes in the header");
  return d;
}

}  // namespace

void write_qkv_dump(const std::string& path, const QkvDump& d) {
  const nlohmann::json j{{"format", 1},
                         {"model", d.model},
                         {"arch", d.arch},
                         {"layer", d.layer},
                         {"context", d.context},
                         {"steps", d.steps},
                         {"hq", d.hq},
                         {"hkv", d.hkv},
                         {"head_dim", d.head_dim},
                         {"positions", d.positions},
                         {"q_multiplier", d.q_multiplier},
                         {"scores", "q·k/sqrt(head_dim)"}};
  const std::string text = j.dump();
  std::ofstream f(path, std::ios::binary);
  require(f.good(), ErrorCode::io, "-o", "cannot write ", path);
  const auto len = static_cast<std::uint64_t>(text.size());
  f.write(kMagic, 8);
  f.write(reinterpret_cast<const char*>(&len), 8);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  write_floats(f, d.q);
  write_floats(f, d.k);
  write_floats(f, d.v);
  require(f.good(), ErrorCode::io, "-o", "writing ", path, " failed");
}

QkvDump read_qkv_dump_header(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return parse_header(f, path);
}

QkvDump read_qkv_dump(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  QkvDump d = parse_header(f, path);
  read_floats(f, d.q, count(d.steps, d.hq, d.head_dim), path);
  read_floats(f, d.k, count(d.context, d.hkv, d.head_dim), path);
  read_floats(f, d.v, count(d.context, d.hkv, d.head_dim), path);
  f.peek();
  require(f.eof(), ErrorCode::invalid_argument, "dump", path, ": trailing bytes after the arrays");
  return d;
}

}  // namespace masskv::cli
