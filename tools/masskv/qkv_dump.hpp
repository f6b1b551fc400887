// The file `masskv dump` writes and `masskv study --generators dump:FILE` reads: one model
// layer's real attention inputs. Layout (little-endian):
//   8 bytes "MKVDUMP1", u64 header length, the JSON header, then f32 arrays
//   q [steps][hq][head_dim], k [context][hkv][head_dim], v [context][hkv][head_dim].
// The header holds model, arch, layer, context, steps, hq, hkv, head_dim, q_multiplier, positions
// (of the query tokens) and "scores": "q·k/sqrt(head_dim)" — q is stored pre-multiplied by
// attn_scale·sqrt(head_dim), so the study's scores equal the model's attention logits.
// The queries are those of the `steps` tokens that follow the context; the keys and values
// are the context's only (the queries' own tokens are left out, as a decode step over a
// cache of `context` tokens).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace masskv::cli {

struct QkvDump {
  std::string model, arch;
  int layer = 0, steps = 0, hq = 0, hkv = 0, head_dim = 0;
  std::int64_t context = 0;
  std::vector<std::int64_t> positions;
  // What q was multiplied by (the model's attn_scale · sqrt(head_dim)); 0 in files written
  // before it was recorded. Dividing it out gives the model's own q (a learned selector's input).
  double q_multiplier = 0;
  std::vector<float> q, k, v;
};

void write_qkv_dump(const std::string& path, const QkvDump& d);
// Throws masskv::Error(io / invalid_argument) on a missing, truncated or inconsistent file.
QkvDump read_qkv_dump(const std::string& path);
// The header only (sizes), without reading the arrays.
QkvDump read_qkv_dump_header(const std::string& path);

}  // namespace masskv::cli
