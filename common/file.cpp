#include "common/file.h"

#include <fstream>
#include <sstream>
#include <system_error>

#include "common/error.h"

namespace lockstep {

void require_readable_file(const std::filesystem::path& path, std::string_view what) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  LS_REQUIRE(std::filesystem::exists(status), ErrorKind::kIo, "{} {} does not exist", what, path.string());
  LS_REQUIRE(!std::filesystem::is_directory(status), ErrorKind::kIo, "{} {} is a folder, not a file", what,
             path.string());
  std::ifstream in(path, std::ios::binary);
  LS_REQUIRE(in.good(), ErrorKind::kIo, "cannot read {} {}", what, path.string());
}

std::string read_whole_file(const std::filesystem::path& path, std::string_view what) {
  require_readable_file(path, what);
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  LS_REQUIRE(!in.bad(), ErrorKind::kIo, "cannot read {} {}", what, path.string());
  return s.str();
}

}  // namespace lockstep
