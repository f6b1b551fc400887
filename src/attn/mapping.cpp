#include "masskv/mapping.hpp"

#include <cmath>

#include "masskv/error.hpp"

namespace masskv {

void Mapping::validate() const {
  if (kind != Kind::entmax) return;
  // alpha -> 1 is softmax (docs/design.md §2); entmax formulas divide by alpha - 1.
  require(std::isfinite(alpha) && alpha > 1.0 && alpha <= 2.0, ErrorCode::invalid_argument, "alpha",
          "entmax needs a finite alpha in (1, 2], got ", alpha);
}

}  // namespace masskv
