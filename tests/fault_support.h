// A rank that dies or stops in the middle of a multi-rank job: how long the
// job takes to end. Shared by the CPU-rank and the multi-GPU tests.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>

#include "cli_support.h"

namespace lockstep::testing_cli {

// Starts a 2-rank generation of `model` in the background (with
// `engine_args`, e.g. the backend, and --collective-timeout 3), waits until
// it decodes, sends `signal` to rank 1, and returns the seconds until the
// whole job ended (its exit code in *exit_code), or -1 if it outlived 20 s.
// `new_tokens` must keep the job decoding for the 1.5 s before the signal.
inline double seconds_to_end_after_signal(const std::filesystem::path& dir, const std::filesystem::path& model,
                                          int signal, const std::string& engine_args, int new_tokens, int* exit_code) {
  auto log = dir / "job.log", rc = dir / "job.rc";
  // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on "(" + std::string&&.
  std::string job = "(";
  job += mpirun(2);
  job += lockstep("--log-level info --collective-timeout 3 generate " + engine_args + " --model " + model.string() +
                  " --prompt-ids 1,2,3 --ignore-eos --max-new-tokens " + std::to_string(new_tokens));
  job += " >" + log.string() + " 2>&1; echo $? >" + rc.string() + ") &";
  EXPECT_EQ(std::system(job.c_str()), 0);
  std::regex pid_line(R"(\[rank 1\] \[info\] rank 1 of 2 \(local rank \d+\), pid (\d+))");
  std::smatch m;
  long pid = 0;
  for (int i = 0; i < 600 && pid == 0; ++i) {  // up to 60 s for start-up and loading
    std::string text = read_file(log);
    if (std::regex_search(text, m, pid_line) && text.find("[rank 1] [info] loaded") != std::string::npos)
      pid = std::stol(m[1]);
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GT(pid, 0) << read_file(log);
  if (pid == 0) return -1;
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // well into decoding
  EXPECT_FALSE(std::filesystem::exists(rc)) << "job ended before the signal: " << read_file(log);
  auto sent = std::chrono::steady_clock::now();
  EXPECT_EQ(::kill(static_cast<pid_t>(pid), signal), 0);
  while (!std::filesystem::exists(rc) && std::chrono::steady_clock::now() - sent < std::chrono::seconds(20))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
  if (!std::filesystem::exists(rc)) {
    ::kill(static_cast<pid_t>(pid), SIGKILL);
    return -1;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  *exit_code = std::stoi(read_file(rc));
  std::printf("job ended %.2f s after signal %d to rank 1 (exit code %d)\n", seconds, signal, *exit_code);
  return seconds;
}

}  // namespace lockstep::testing_cli
