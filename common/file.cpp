#include "common/file.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <system_error>

#include "common/error.h"

namespace lockstep {

namespace {

// Appends what `read` gives (bytes into a buffer, 0 at the end), failing
// past `most` bytes.
template <typename Read>
std::string read_all(Read read, std::string_view what, int64_t most) {
  std::string out;
  char buffer[1 << 16];
  for (size_t got; (got = read(buffer, sizeof buffer)) > 0;) {
    LS_REQUIRE(static_cast<int64_t>(out.size() + got) <= most, ErrorKind::kIo, "{} is larger than {} bytes", what,
               most);
    out.append(buffer, got);
  }
  return out;
}

}  // namespace

void require_model_folder(const std::filesystem::path& dir) {
  std::error_code ec;
  LS_REQUIRE(!std::filesystem::is_regular_file(dir, ec), ErrorKind::kIo,
             "--model {} is a file: give the model's folder (config.json, *.safetensors)", dir.string());
  LS_REQUIRE(std::filesystem::is_directory(dir, ec), ErrorKind::kIo, "model folder not found: {}", dir.string());
}

bool path_present(const std::filesystem::path& path) {
  std::error_code ec;
  return std::filesystem::exists(std::filesystem::symlink_status(path, ec));
}

void require_readable_file(const std::filesystem::path& path, std::string_view what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    LS_FAIL(ErrorKind::kIo, "cannot read {} {}: {}", what, path.string(), ec.message());
  LS_REQUIRE(fs::exists(status), ErrorKind::kIo, "{} {} does not exist", what, path.string());
  LS_REQUIRE(!fs::is_directory(status), ErrorKind::kIo, "{} {} is a folder, not a file", what, path.string());
  LS_REQUIRE(fs::is_regular_file(status) || fs::is_fifo(status), ErrorKind::kIo, "{} {} is a device, not a file",
             what, path.string());
  LS_REQUIRE(::access(path.c_str(), R_OK) == 0, ErrorKind::kIo, "cannot read {} {}: permission denied", what,
             path.string());
}

std::string read_whole_file(const std::filesystem::path& path, std::string_view what) {
  require_readable_file(path, what);
  std::ifstream in(path, std::ios::binary);
  const std::string named = fmt::format("{} {}", what, path.string());
  LS_REQUIRE(in.good(), ErrorKind::kIo, "cannot read {}", named);
  std::error_code ec;
  const int64_t most = std::filesystem::is_regular_file(path, ec) ? INT64_MAX : kMaxStreamBytes;
  std::string text = read_all(
      [&](char* buffer, size_t size) {
        in.read(buffer, static_cast<std::streamsize>(size));
        return static_cast<size_t>(in.gcount());
      },
      named, most);
  LS_REQUIRE(!in.bad(), ErrorKind::kIo, "cannot read {}", named);
  return text;
}

std::string read_standard_input(std::string_view what) {
  std::string text =
      read_all([](char* buffer, size_t size) { return std::fread(buffer, 1, size, stdin); }, what, kMaxStreamBytes);
  LS_REQUIRE(!std::ferror(stdin), ErrorKind::kIo, "cannot read {} from standard input", what);
  return text;
}

}  // namespace lockstep
