// CLI values of `masskv distill` (include/masskv/learn/train.hpp), parsed in the library so the
// tests check their errors.
#include <charconv>
#include <set>
#include <string>

#include "masskv/error.hpp"
#include "masskv/learn/train.hpp"

namespace masskv::learn {
namespace {

int parse_index(std::string_view s, std::string_view text, std::string_view option) {
  int v = -1;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  require(!s.empty() && ec == std::errc() && end == s.data() + s.size() && v >= 0,
          ErrorCode::invalid_argument, option, "expected layers like 0-29 or 3,5,7, got '", text,
          "'");
  return v;
}

}  // namespace

std::vector<int> parse_layer_list(std::string_view text, int n_layer, std::string_view option) {
  std::set<int> layers;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = text.substr(start, comma - start);
    const std::size_t dash = item.find('-');
    const int lo = parse_index(item.substr(0, dash), text, option);
    const int hi = dash == std::string_view::npos ? lo : parse_index(item.substr(dash + 1), text, option);
    require(lo <= hi, ErrorCode::invalid_argument, option, "range ", item, " is empty");
    require(hi < n_layer, ErrorCode::invalid_argument, option, "layer ", hi,
            " outside the model's ", n_layer, " layers");
    for (int l = lo; l <= hi; ++l) layers.insert(l);
    start = comma + 1;
  }
  return {layers.begin(), layers.end()};
}

Input parse_input(std::string_view text, std::string_view option) {
  if (text == "qk") return Input::qk;
  if (text == "hidden") return Input::hidden;
  fail(ErrorCode::invalid_argument, option, "expected qk or hidden, got '", text, "'");
}

Init parse_init(std::string_view text, std::string_view option) {
  if (text == "pca") return Init::pca;
  if (text == "random") return Init::random;
  fail(ErrorCode::invalid_argument, option, "expected pca or random, got '", text, "'");
}

int parse_groups(std::string_view text, int n_head_kv, std::string_view option) {
  if (text == "collapsed") return 1;
  if (text == "kv") return n_head_kv;
  fail(ErrorCode::invalid_argument, option, "expected collapsed or kv, got '", text, "'");
}

}  // namespace masskv::learn
