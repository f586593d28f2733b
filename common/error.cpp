#include "common/error.h"

namespace lockstep {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return "invalid argument";
    case ErrorKind::kModel: return "model error";
    case ErrorKind::kIo: return "I/O error";
    case ErrorKind::kCuda: return "CUDA error";
    case ErrorKind::kCublas: return "cuBLAS error";
    case ErrorKind::kNccl: return "NCCL error";
    case ErrorKind::kMpi: return "MPI error";
    case ErrorKind::kOutOfMemory: return "out of memory";
    case ErrorKind::kRankFailure: return "rank failure";
    case ErrorKind::kInternal: return "internal error";
  }
  return "error";
}

ProcessIdentity& process_identity() {
  static ProcessIdentity identity;
  return identity;
}

std::string escape_nul(const std::string& message) {
  if (message.find('\0') == std::string::npos) return message;
  std::string out;
  out.reserve(message.size() + 8);
  for (char c : message) {
    if (c == '\0')
      out += "\\x00";
    else
      out += c;
  }
  return out;
}

void throw_error(ErrorKind kind, const std::string& message) { throw Error(kind, message); }

void throw_check_failure(ErrorKind kind, const char* statement, const std::string& detail,
                         const char* file, int line) {
  const ProcessIdentity& id = process_identity();
  std::string device = id.device < 0 ? "cpu" : std::to_string(id.device);
  throw Error(kind, fmt::format("{} failed: {} (rank {}, device {}, {}:{})", statement, detail,
                                id.rank, device, file, line));
}

}  // namespace lockstep
