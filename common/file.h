// Reading a whole input file, the one way every command does it: a path that
// is missing, a folder, a device or unreadable fails with a message naming
// what the file was for ("--prompt-file", "chat template", ...) and the
// problem. A regular file is read whole; a stream (a pipe, standard input)
// up to kMaxStreamBytes, so that one that never ends fails instead of
// filling memory.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace lockstep {

inline constexpr int64_t kMaxStreamBytes = int64_t{1} << 30;

// Fails (ErrorKind::kIo) unless `path` names a regular file or a pipe that
// this process may read. Does not open it (a pipe is read once).
void require_readable_file(const std::filesystem::path& path, std::string_view what);

// Fails (ErrorKind::kIo) unless `dir` is a folder: a model folder given as
// --model, named as a file or as missing.
void require_model_folder(const std::filesystem::path& dir);

// Whether anything is at `path`, a link that dangles or loops included (so
// that reading it then names the actual problem); never throws.
bool path_present(const std::filesystem::path& path);

// The file's bytes, after require_readable_file.
std::string read_whole_file(const std::filesystem::path& path, std::string_view what);

// Standard input to its end, at most kMaxStreamBytes; a read error fails.
std::string read_standard_input(std::string_view what);

}  // namespace lockstep
