// Reading a whole input file, the one way every command does it: a path that
// is missing, a folder or unreadable fails with a message naming what the
// file was for ("prompt file", "--prompts-file", ...) and the problem, and so
// does input past kMaxInputBytes (a device that never ends, as /dev/zero).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace lockstep {

inline constexpr int64_t kMaxInputBytes = int64_t{1} << 30;

// Fails (ErrorKind::kIo) unless `path` names a file (not a folder) that can be opened.
void require_readable_file(const std::filesystem::path& path, std::string_view what);

// The file's bytes (after require_readable_file), at most kMaxInputBytes.
std::string read_whole_file(const std::filesystem::path& path, std::string_view what);

// Standard input to its end, at most kMaxInputBytes; a read error fails.
std::string read_standard_input(std::string_view what);

}  // namespace lockstep
