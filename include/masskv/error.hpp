// masskv::Error: the one exception type of the library (docs/design.md §6).
// Every check names the argument it rejects, so a user can tell which input was wrong
// without reading the source.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace masskv {

enum class ErrorCode {
  invalid_argument,  // a value outside its documented domain (alpha, page size, ...)
  shape_mismatch,    // sizes or strides that do not fit together
  out_of_range,      // an index (page id, token id, sequence id) outside its container
  non_finite,        // NaN or inf where finite numbers are required
  unsupported,       // a valid request this build cannot serve (dtype, head_dim, ISA)
  out_of_memory,     // the page pool is exhausted
  io,                // files
};

std::string_view to_string(ErrorCode code) noexcept;

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string argument, const std::string& message);
  ErrorCode code() const noexcept { return code_; }
  // The name of the argument that was rejected ("indptr", "alpha", ...).
  const std::string& argument() const noexcept { return argument_; }

 private:
  ErrorCode code_;
  std::string argument_;
};

namespace detail {
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
}  // namespace detail

// Throws Error(code, argument, "<argument>: <message parts>").
template <class... Parts>
[[noreturn]] void fail(ErrorCode code, std::string_view argument, const Parts&... parts) {
  throw Error(code, std::string(argument), detail::concat(argument, ": ", parts...));
}

template <class... Parts>
void require(bool ok, ErrorCode code, std::string_view argument, const Parts&... parts) {
  if (!ok) fail(code, argument, parts...);
}

}  // namespace masskv
