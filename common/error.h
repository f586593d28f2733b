// Typed errors and the CHECK family used everywhere in lockstep.
//
// Every failure is a lockstep::Error carrying a kind and a one-line message.
// launch/ catches it, prints the message once, and ends the job (MPI_Abort
// when several ranks run), so a bad input never becomes a crash or a hang.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace lockstep {

enum class ErrorKind {
  kInvalidArgument,  // a bad command-line value or request
  kModel,            // a malformed or unsupported model folder / config / tensor
  kIo,               // a file that cannot be read or written
  kCuda,
  kCublas,
  kNccl,
  kMpi,
  kOutOfMemory,  // what the run needs does not fit the memory it runs in
  kRankFailure,  // another rank failed; this one is going down with it
  kInternal,
};

const char* error_kind_name(ErrorKind kind);

// `message` with each NUL byte written as the text \x00: what() is a C
// string, and a NUL from an input (a JSON "\u0000") would cut it short.
std::string escape_nul(const std::string& message);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message)
      : std::runtime_error(escape_nul(message)), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// Identity of this process, filled in once by launch/ and printed with every
// failed CHECK (rank and device).
struct ProcessIdentity {
  int rank = 0;
  int world_size = 1;
  int device = -1;  // -1: CPU backend
};
ProcessIdentity& process_identity();

[[noreturn]] void throw_error(ErrorKind kind, const std::string& message);

// Formats "<statement> failed: <detail> (rank R, device D, file:line)".
[[noreturn]] void throw_check_failure(ErrorKind kind, const char* statement,
                                      const std::string& detail, const char* file,
                                      int line);

}  // namespace lockstep

// Fails with kind `kind` and a formatted message when `cond` is false.
#define LS_REQUIRE(cond, kind, ...)                                          \
  do {                                                                       \
    if (!(cond)) ::lockstep::throw_error((kind), fmt::format(__VA_ARGS__)); \
  } while (0)

#define LS_FAIL(kind, ...) ::lockstep::throw_error((kind), fmt::format(__VA_ARGS__))

// Internal invariant: reports the statement and location.
#define LS_CHECK(cond)                                                          \
  do {                                                                          \
    if (!(cond))                                                                \
      ::lockstep::throw_check_failure(::lockstep::ErrorKind::kInternal, #cond, \
                                      "invariant violated", __FILE__, __LINE__); \
  } while (0)
