// Reading a whole input file, the one way every command does it: a path that
// is missing, a folder or unreadable fails with a message naming what the
// file was for ("prompt file", "--prompts-file", ...) and the problem.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace lockstep {

// Fails (ErrorKind::kIo) unless `path` names a regular file that can be opened.
void require_readable_file(const std::filesystem::path& path, std::string_view what);

// The file's bytes (after require_readable_file).
std::string read_whole_file(const std::filesystem::path& path, std::string_view what);

}  // namespace lockstep
