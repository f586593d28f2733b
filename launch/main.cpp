// lockstep: the command-line entry point. Parses the command line, sets up
// the MPI world and logging, runs one subcommand, and turns every failure
// into one line naming the problem and a non-zero exit of the whole job.
#include <unistd.h>

#include <exception>
#include <string>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "launch/commands.h"
#include "launch/world.h"

int main(int argc, char** argv) {
  using namespace lockstep;
  cli::init_world(&argc, &argv);
  CLI::App app{"lockstep: tensor-parallel LLM inference, one MPI rank per device"};
  app.require_subcommand(1);
  app.fallthrough();  // global options may follow the subcommand
  std::string log_level = "info";
  auto* level_opt = app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off")
                        ->capture_default_str();
  double collective_timeout_s = 60.0;
  app.add_option("--collective-timeout", collective_timeout_s,
                 "seconds a collective may take before the job is ended (a peer that stopped or hangs)")
      ->capture_default_str();
  cli::CommandTable table;
  cli::add_model_commands(app, table);
  cli::add_bench_command(app, table);
  cli::add_make_model_command(app, table);
  cli::add_tokenize_commands(app, table);
  cli::add_chat_command(app, table);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);  // prints help or the parse error (rank 0 only would be nicer, but all agree)
    cli::finalize_world();
    return code;
  }
  int code = 1;
  try {
    cli::setup_logging(log_level, level_opt->count() > 0);
    cli::connect_world(collective_timeout_s);
    spdlog::info("rank {} of {} (local rank {}), pid {}", cli::world().rank, cli::world().size,
                 cli::world().local_rank, static_cast<long>(getpid()));
    for (auto& [sub, run] : table.entries)
      if (sub->parsed()) code = run();
  } catch (const Error& e) {
    spdlog::error("{}: {}", error_kind_name(e.kind()), e.what());
    cli::abort_world(2);
  } catch (const std::exception& e) {
    spdlog::error("unexpected failure: {}", e.what());
    cli::abort_world(3);
  }
  cli::finalize_world();
  return code;
}
