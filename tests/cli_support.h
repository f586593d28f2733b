// Running the lockstep executable (and mpirun) from tests.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace lockstep::testing_cli {

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The lockstep executable beside the running test binary, so that a build
// copied elsewhere (as onto the GPU machine) runs its own; else the one the
// build made.
inline std::string binary() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::filesystem::path beside = self.parent_path() / "lockstep";
    if (std::filesystem::is_regular_file(beside, ec)) return beside.string();
  }
  return LOCKSTEP_BINARY;
}

// Open MPI's session directory for this test process's mpiruns, removed at
// exit. ctest runs test processes side by side, and under the shared default
// (/tmp/ompi.HOST.UID) an mpirun that ends can remove the tree another is
// creating its job's directory in; that one then fails to start (seen in CI:
// "A call to mkdir was unable to create the desired directory:
// /tmp/ompi.vm.0/pid.1444"). One process's mpiruns run one after another.
inline const std::string& mpi_session_dir() {
  struct SessionDir {
    std::filesystem::path path;
    SessionDir() : path(std::filesystem::temp_directory_path() / ("lockstep_ompi_" + std::to_string(getpid()))) {
      std::filesystem::create_directories(path);
    }
    ~SessionDir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const SessionDir dir;
  static const std::string text = dir.path.string();
  return text;
}

// mpirun with what running as root in a container needs; --oversubscribe
// because CI has 2 cores and the tests start up to 4 ranks; its own session
// directory (mpi_session_dir; Open MPI 4 reads orte_tmpdir_base, 5 prte's).
inline std::string mpirun(int ranks) {
  return "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 "
         "OMPI_MCA_orte_tmpdir_base=" + mpi_session_dir() + " PRTE_MCA_prte_tmpdir_base=" + mpi_session_dir() +
         " mpirun --oversubscribe --bind-to none -np " + std::to_string(ranks) + " ";
}

// Runs `args` through the shell (with a hard time limit, so a hang fails the
// test instead of stalling the suite) and captures stdout, stderr and the code.
inline CommandResult run(const std::string& args, const std::filesystem::path& scratch, int timeout_s = 120) {
  std::filesystem::create_directories(scratch);
  auto out = scratch / "stdout.txt", err = scratch / "stderr.txt";
  std::string cmd = "timeout -k 5 " + std::to_string(timeout_s) + " " + args + " >" + out.string() + " 2>" +
                    err.string();
  int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

inline std::string lockstep(const std::string& args) { return binary() + " " + args; }

// A --prompts-file of 7 requests sharing a 19-token prefix, each with 1-7
// tokens of its own (161 prompt tokens in all) and 3, 5, ... 15 new tokens.
inline void write_shared_prefix_prompts(const std::filesystem::path& file) {
  std::ofstream out(file);
  for (int i = 0; i < 7; ++i) {
    std::string ids = "1, 20, 300, 4, 55, 66, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19";
    for (int j = 0; j <= i; ++j) ids += ", " + std::to_string(100 + 13 * i + j);
    out << "{\"prompt_ids\": [" << ids << "], \"max_new_tokens\": " << 3 + 2 * i << "}\n";
  }
}

// Element `index` of the BF16 tensor `name` in a single-file checkpoint set
// to the bf16 value whose bits are `bits` (0x7f80: +inf).
inline void set_bf16_element(const std::filesystem::path& safetensors, const std::string& name, int64_t index,
                             uint16_t bits) {
  std::string bytes = read_file(safetensors);
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  const nlohmann::json tensor = nlohmann::json::parse(bytes.substr(8, header)).at(name);
  if (tensor.at("dtype") != "BF16") throw std::runtime_error(name + " is not BF16");
  const size_t at = 8 + header + tensor.at("data_offsets")[0].get<size_t>() + 2 * static_cast<size_t>(index);
  if (at + 2 > bytes.size()) throw std::runtime_error(name + " has no element " + std::to_string(index));
  std::memcpy(bytes.data() + at, &bits, 2);
  std::ofstream(safetensors, std::ios::binary) << bytes;
}

}  // namespace lockstep::testing_cli
