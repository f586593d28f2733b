// lockstep: the command-line entry point. Parses the command line, sets up
// the MPI world and logging, runs one subcommand, and turns every failure
// into one line naming the problem and a non-zero exit of the whole job.
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/utf8.h"
#include "launch/commands.h"
#include "launch/world.h"

namespace {

// The one line a command-line mistake gets: CLI11's message, or for a missing
// or unknown command the commands there are. argv's first word that is
// neither an option nor the value of a global option is the command asked for.
std::string parse_failure(const CLI::App& app, const CLI::ParseError& e, int argc, char** argv) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    names.push_back(sub->get_name());
  const std::string commands = fmt::format("commands: {}", fmt::join(names, ", "));
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    if (sub->parsed()) return fmt::format("{} (lockstep {} --help lists its options)", e.what(), sub->get_name());
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] == '-') {
      const bool takes_value =
          std::strcmp(argv[i], "--log-level") == 0 || std::strcmp(argv[i], "--collective-timeout") == 0;
      i += takes_value ? 1 : 0;
      continue;
    }
    if (std::find(names.begin(), names.end(), argv[i]) != names.end())
      return fmt::format("{} (lockstep {} --help lists its options)", e.what(), argv[i]);
    return fmt::format("unknown command '{}' ({})", argv[i], commands);
  }
  if (std::strstr(e.what(), "subcommand is required") != nullptr) return fmt::format("no command given ({})", commands);
  return fmt::format("{} (lockstep --help lists the {})", e.what(), commands);
}

// Options whose value may be empty: an empty prompt, system message or stop
// string means something (the last is refused by its own check, by name).
constexpr const char* kMayBeEmpty[] = {"--prompt", "--system", "--stop"};

// Refuses an empty value ('') for every other option given: a path, a list
// or a number left empty by a script is a mistake, never "the default".
void refuse_empty_values(const CLI::App& app) {
  std::vector<const CLI::App*> apps{&app};
  for (const CLI::App* sub : app.get_subcommands()) apps.push_back(sub);
  for (const CLI::App* a : apps)
    for (const CLI::Option* opt : a->get_options()) {
      if (opt->count() == 0 || opt->get_type_size() == 0) continue;  // not given, or a flag
      const std::string name = opt->get_name();
      if (std::find(std::begin(kMayBeEmpty), std::end(kMayBeEmpty), name) != std::end(kMayBeEmpty)) continue;
      for (const std::string& value : opt->results())
        LS_REQUIRE(!value.empty(), lockstep::ErrorKind::kInvalidArgument, "{} must not be empty", name);
    }
}

// --collective-timeout: at least a millisecond (the transports wait in
// milliseconds) and at most 1e7 s (~115 days; a deadline in nanoseconds
// holds far more).
void check_collective_timeout(double seconds) {
  LS_REQUIRE(seconds >= 1e-3 && seconds <= 1e7, lockstep::ErrorKind::kInvalidArgument,
             "--collective-timeout must be between 0.001 and 1e7 seconds, got {}", seconds);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace lockstep;
  std::signal(SIGPIPE, SIG_IGN);  // a closed output is an error line (require_stdout_written), not a signal
  cli::init_world(&argc, &argv);
  cli::init_logging();
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
    int code = e.get_exit_code();
    if (code == 0)
      app.exit(e);  // --help
    else
      spdlog::error("invalid argument: {}", printable(parse_failure(app, e, argc, argv)));
    cli::finalize_world();
    return code;
  }
  int code = 1;
  try {
    cli::set_log_level(log_level, level_opt->count() > 0);
    refuse_empty_values(app);
    check_collective_timeout(collective_timeout_s);
    cli::connect_world(collective_timeout_s);
    spdlog::info("rank {} of {} (local rank {}), pid {}", cli::world().rank, cli::world().size,
                 cli::world().local_rank, static_cast<long>(getpid()));
    for (auto& [sub, run] : table.entries)
      if (sub->parsed()) code = run();
    // Output that did not reach standard output (a full disk, a closed pipe
    // reader) is a failed run, whatever the command printed it with.
    cli::require_stdout_written();
  } catch (const Error& e) {
    spdlog::error("{}: {}", error_kind_name(e.kind()), printable(e.what()));
    cli::abort_world(2);
  } catch (const std::exception& e) {
    spdlog::error("unexpected failure: {}", printable(e.what()));
    cli::abort_world(3);
  }
  cli::finalize_world();
  return code;
}
