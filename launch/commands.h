// Subcommands of the `lockstep` executable. Each launch/cmd_*.cpp file adds
// its subcommands to the CLI11 app and registers what to run; main.cpp parses
// the command line, sets up logging and MPI, runs the chosen command and turns
// any lockstep::Error into a one-line message and a non-zero exit.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <utility>
#include <vector>

namespace lockstep::cli {

// Runs after parsing; returns the process exit code.
using CommandRun = std::function<int()>;

struct CommandTable {
  std::vector<std::pair<CLI::App*, CommandRun>> entries;
  void add(CLI::App* app, CommandRun run) { entries.emplace_back(app, std::move(run)); }
};

void add_model_commands(CLI::App& root, CommandTable& table);     // generate, score, bench
void add_bench_command(CLI::App& root, CommandTable& table);       // bench
void add_make_model_command(CLI::App& root, CommandTable& table); // make-model
void add_tokenize_commands(CLI::App& root, CommandTable& table);  // tokenize, detokenize

}  // namespace lockstep::cli
