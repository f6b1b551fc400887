#include "masskv/error.hpp"

namespace masskv {

std::string_view to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::invalid_argument: return "invalid_argument";
    case ErrorCode::shape_mismatch: return "shape_mismatch";
    case ErrorCode::out_of_range: return "out_of_range";
    case ErrorCode::non_finite: return "non_finite";
    case ErrorCode::unsupported: return "unsupported";
    case ErrorCode::out_of_memory: return "out_of_memory";
    case ErrorCode::io: return "io";
  }
  return "unknown";
}

Error::Error(ErrorCode code, std::string argument, const std::string& message)
    : std::runtime_error(message), code_(code), argument_(std::move(argument)) {}

}  // namespace masskv
