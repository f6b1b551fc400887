// The long real English text of the CLI (eval's real-text haystacks, dump's context).
#pragma once

#include <string>

namespace masskv::cli {

// `path` when given, else $MASSKV_TEXT, else the Debian Policy Manual that
// `scripts/setup.sh --models` installs (debian-policy), decompressed. Errors name `option`.
std::string load_text(const std::string& path, const char* option);

}  // namespace masskv::cli
