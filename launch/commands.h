// Subcommands of the `lockstep` executable. Each launch/cmd_*.cpp file adds
// its subcommands to the CLI11 app and registers what to run; main.cpp parses
// the command line, sets up logging and MPI, runs the chosen command and turns
// any lockstep::Error into a one-line message and a non-zero exit.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/integers.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/stop_strings.h"
#include "tokenizer/tokenizer.h"

namespace lockstep::cli {

// Runs after parsing; returns the process exit code.
using CommandRun = std::function<int()>;

struct CommandTable {
  std::vector<std::pair<CLI::App*, CommandRun>> entries;
  void add(CLI::App* app, CommandRun run) { entries.emplace_back(app, std::move(run)); }
};

// Fails before any work when `option`'s output file could not be written
// (its folder missing or read-only, or the path a folder), rather than after
// a run whose result would then be lost.
inline void require_output_path(const std::string& path, const char* option) {
  namespace fs = std::filesystem;
  const fs::path folder = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
  std::error_code ec;
  LS_REQUIRE(fs::path(path).filename().string().size() <= 255, ErrorKind::kInvalidArgument,
             "{} {}: the file name is longer than 255 bytes", option, path);
  LS_REQUIRE(!fs::exists(folder, ec) || fs::is_directory(folder, ec), ErrorKind::kInvalidArgument,
             "{} {}: {} is a file, not a folder", option, path, folder.string());
  LS_REQUIRE(fs::is_directory(folder, ec), ErrorKind::kInvalidArgument, "{} {}: folder {} does not exist", option,
             path, folder.string());
  LS_REQUIRE(!fs::is_directory(path, ec), ErrorKind::kInvalidArgument, "{} {}: is a folder", option, path);
  LS_REQUIRE(::access(folder.c_str(), W_OK) == 0, ErrorKind::kInvalidArgument, "{} {}: folder {} is not writable",
             option, path, folder.string());
}

// A prompt as a conversation rendered by a chat template (cmd_chat.cpp).
struct ChatOptions {
  bool chat = false;
  std::string system;
  std::string messages_file;
  std::string template_file;
  std::string template_kwargs;  // a JSON object
  bool no_generation_prompt = false;
  bool active() const { return chat || !messages_file.empty(); }
};
// --chat (when `chat_flag`), --system, --messages, --chat-template, --chat-template-kwargs.
void add_chat_options(CLI::App* cmd, ChatOptions& c, bool chat_flag);
// Fails when chat-only options are given without --chat or --messages.
void check_chat_options(const ChatOptions& c);
// The rendered conversation: --messages, or --system and `user_text` as the user's message.
std::string render_chat(const ChatOptions& c, const std::filesystem::path& model_dir,
                        const std::optional<std::string>& user_text);
// The template --chat-template names, else the model folder's (parsed: a syntax error fails here).
ChatTemplate load_chat_template(const ChatOptions& c, const std::filesystem::path& model_dir);
// `messages` (a JSON list) through the template --chat-template / the model's, with --chat-template-kwargs.
std::string render_conversation(const ChatOptions& c, const std::filesystem::path& model_dir,
                                const nlohmann::ordered_json& messages);

// Options every model-running subcommand shares (cmd_model.cpp).
struct ModelRunConfig {
  EngineOptions engine;
  std::string diag;
  std::string prompt_ids;
  std::string dump_logits;
  CLI::Option* max_batch_option = nullptr;  // given on the command line or not
};
void add_engine_options(CLI::App* cmd, ModelRunConfig& c);
// CLI11 checks: the option's value is an integer >= least; a uint64.
CLI::Validator integer_at_least(long long least);
CLI::Validator unsigned_integer();
// "1,2,3" -> token ids (parse_int_list, then the int32 range).
std::vector<int32_t> parse_id_list(const std::string& text, const char* option);
void log_start(const char* what, const ModelRunConfig& c);

// --stop-ids / --ignore-eos, and what they resolve to once the model is
// known; --stop, the stop strings (tokenizer/stop_strings.h).
struct StopOptions {
  std::string ids;
  bool ignore_eos = false;
  std::vector<std::string> strings;
};
// --max-new-tokens, --temperature, --top-k, --top-p, --seed, --stop-ids,
// --stop and (`with_ignore_eos`) --ignore-eos, for generate and chat.
void add_generation_options(CLI::App* cmd, GenerationRequest& request, StopOptions& stop, bool with_ignore_eos);
// --stop-ids as given, else the model's eos ids unless --ignore-eos.
std::vector<int32_t> resolve_stop_ids(const StopOptions& stop, const ModelConfig& config);
// Fails, naming --stop, on a stop string check_stop_strings refuses.
void check_stop_option(const StopOptions& stop);
// Ends `request` where `text` finds a stop string: the generator shows it
// each generated id (on every rank, so that every rank stops alike).
void stop_on_strings(GenerationRequest& request, StopStringStream& text);
// --tokenizer, else the model folder's tokenizer.json.
Tokenizer load_tokenizer(const std::filesystem::path& model_dir, const std::string& tokenizer_option);

void add_model_commands(CLI::App& root, CommandTable& table);     // generate, score, bench
void add_chat_command(CLI::App& root, CommandTable& table);        // apply-chat-template
void add_bench_command(CLI::App& root, CommandTable& table);       // bench
void add_make_model_command(CLI::App& root, CommandTable& table); // make-model
void add_tokenize_commands(CLI::App& root, CommandTable& table);  // tokenize, detokenize

}  // namespace lockstep::cli
