#include "common/file.h"

#include <cstdio>
#include <fstream>
#include <system_error>

#include "common/error.h"

namespace lockstep {

namespace {

// Appends what `read` gives (bytes into a buffer, 0 at the end) up to the cap.
template <typename Read>
std::string read_capped(Read read, std::string_view what) {
  std::string out;
  char buffer[1 << 16];
  for (size_t got; (got = read(buffer, sizeof buffer)) > 0;) {
    LS_REQUIRE(static_cast<int64_t>(out.size() + got) <= kMaxInputBytes, ErrorKind::kIo,
               "{} is larger than {} bytes", what, kMaxInputBytes);
    out.append(buffer, got);
  }
  return out;
}

}  // namespace

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
  const std::string named = fmt::format("{} {}", what, path.string());
  std::string text = read_capped(
      [&](char* buffer, size_t size) {
        in.read(buffer, static_cast<std::streamsize>(size));
        return static_cast<size_t>(in.gcount());
      },
      named);
  LS_REQUIRE(!in.bad(), ErrorKind::kIo, "cannot read {}", named);
  return text;
}

std::string read_standard_input(std::string_view what) {
  std::string text = read_capped([](char* buffer, size_t size) { return std::fread(buffer, 1, size, stdin); }, what);
  LS_REQUIRE(!std::ferror(stdin), ErrorKind::kIo, "cannot read {} from standard input", what);
  return text;
}

}  // namespace lockstep
