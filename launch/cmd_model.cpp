// generate and score: the subcommands that run a model.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/file.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "engine/io/npy.h"
#include "launch/commands.h"
#include "launch/generation_clock.h"
#include "launch/world.h"
#include "tokenizer/tokenizer.h"

namespace lockstep::cli {

void add_engine_options(CLI::App* cmd, ModelRunConfig& c) {
  cmd->add_option("--model", c.engine.model_dir, "Hugging Face model folder")->required();
  c.engine.backend = default_backend();
  c.engine.local_rank = world().local_rank;
  c.engine.local_ranks = world().local_size;
  cmd->add_option("--backend", c.engine.backend, "cpu or cuda (default: cuda when a GPU is visible)")
      ->capture_default_str();
  cmd->add_option("--comm", c.engine.comm,
                  "tensor-parallel transport: auto, single, mpi (on cuda: staged through the host, ranks may share "
                  "a GPU), nccl")
      ->capture_default_str();
  cmd->add_option("--devices", c.engine.devices, "GPU of each local rank, e.g. 0,1 (default: local rank)")
      ->delimiter(',');
  cmd->add_option("--dtype", c.engine.dtype,
                  "compute dtype: auto (cpu: float32; cuda: the checkpoint's 16-bit type, float32 -> bfloat16), "
                  "float32, bfloat16, float16")
      ->capture_default_str();
  cmd->add_flag("--eager", c.engine.eager, "no CUDA graphs: launch every op of every decode step");
  cmd->add_flag("--no-pdl", c.engine.no_pdl,
                "CUDA: start each kernel only after the previous one ends (no programmatic dependent launch)");
  c.max_batch_option =
      cmd->add_option("--max-batch", c.engine.max_batch, "sequences at once (sizes the KV cache and the graphs)")
      ->capture_default_str();
  cmd->add_option("--max-step-tokens", c.engine.max_step_tokens,
                  "prompt tokens a forward step may hold; longer prompts are prefilled in chunks of this many "
                  "(0 or unset: 2048 on cuda, 256 on cpu)");
  cmd->add_option("--max-seq-len", c.engine.max_seq_len,
                  "KV cache length (0 or unset: the model's max_position_embeddings, capped by memory; "
                  "a sliding-window model also keeps every position)");
  cmd->add_option("--threads", c.engine.threads,
                  "host threads per rank: the CPU backend's ops and the weights' conversion as they load "
                  "(default: this host's cores divided by its ranks)");
  cmd->add_option("--diag", c.diag, "comma-separated diagnostics: shapes,attn,timing,numerics");
}

CLI::Validator integer_at_least(long long least) {
  return CLI::Validator(
      [least](std::string& text) -> std::string {
        const std::optional<long long> v = whole_integer(text);
        return v && *v >= least ? std::string() : fmt::format("must be an integer >= {}, got '{}'", least, text);
      },
      fmt::format("INT>={}", least));
}

CLI::Validator unsigned_integer() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        size_t used = 0;
        try {
          if (!text.empty() && text[0] != '-') std::stoull(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        return used == text.size() && !text.empty()
                   ? std::string()
                   : fmt::format("must be an integer from 0 to 18446744073709551615, got '{}'", text);
      },
      "UINT64");
}

std::vector<int32_t> parse_id_list(const std::string& text, const char* option) {
  std::vector<int32_t> ids;
  for (int64_t v : parse_int_list(text, option, "token id")) {
    LS_REQUIRE(v >= INT32_MIN && v <= INT32_MAX, ErrorKind::kInvalidArgument,
               "{}: token id {} is outside the vocabulary", option, v);
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

void log_start(const char* what, const ModelRunConfig& c) {
  spdlog::info("{}: {} ranks; {}", what, world().size, c.engine.summary());
}

void add_generation_options(CLI::App* cmd, GenerationRequest& request, StopOptions& stop, bool with_ignore_eos) {
  cmd->add_option("--max-new-tokens", request.max_new_tokens, "tokens to generate (most, with stop ids)")
      ->capture_default_str()
      ->check(integer_at_least(1));
  cmd->add_option("--temperature", request.sampling.temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", request.sampling.top_k, "0 = no limit")->capture_default_str();
  cmd->add_option("--top-p", request.sampling.top_p, "nucleus probability in (0, 1]")->capture_default_str();
  cmd->add_option("--seed", request.sampling.seed, "sampling seed")->capture_default_str()->check(unsigned_integer());
  cmd->add_option("--stop-ids", stop.ids, "comma-separated ids that end generation (default: the model's eos ids)");
  cmd->add_option("--stop", stop.strings,
                  "a text that ends generation, not shown (repeatable; text prompts only; matched in the text "
                  "shown, without special tokens)")
      ->allow_extra_args(false);
  if (with_ignore_eos)
    cmd->add_flag("--ignore-eos", stop.ignore_eos, "generate --max-new-tokens tokens, ignoring the eos ids");
}

std::vector<int32_t> resolve_stop_ids(const StopOptions& stop, const ModelConfig& config) {
  if (!stop.ids.empty()) return parse_id_list(stop.ids, "--stop-ids");
  return stop.ignore_eos ? std::vector<int32_t>{} : config.eos_token_ids;
}

void check_stop_option(const StopOptions& stop) {
  try {
    check_stop_strings(stop.strings);
  } catch (const Error& e) {
    LS_FAIL(e.kind(), "--stop: {}", e.what());
  }
}

void stop_on_strings(GenerationRequest& request, StopStringStream& text) {
  request.stops_after = [&text](int32_t id) { return text.push(id); };
}

Tokenizer load_tokenizer(const std::filesystem::path& model_dir, const std::string& tokenizer_option) {
  if (tokenizer_option.empty()) require_model_folder(model_dir);
  return Tokenizer::load(tokenizer_option.empty() ? model_dir / "tokenizer.json"
                                                  : std::filesystem::path(tokenizer_option));
}

namespace {

// A prompt in text (--prompt or --prompt-file) goes through the model's
// tokenizer.json (or --tokenizer); the output is then streamed as text.
struct TextOptions {
  std::optional<std::string> prompt;  // given, even empty: the tokenizer may still add its BOS
  std::string prompt_file;
  std::string tokenizer;
  bool no_special_tokens = false;  // else the tokenizer's post-processor adds its BOS (as HF's default)
  ChatOptions chat;
  std::string prompts_file;  // one request a line (run_generate_batch)
  bool no_prefix_reuse = false;  // --prompts-file: prefill every prompt whole
  bool text() const { return prompt.has_value() || !prompt_file.empty() || !chat.messages_file.empty(); }
};

std::string read_prompt_file(const std::string& path) { return read_whole_file(path, "--prompt-file"); }

// The prompt's ids: --prompt-ids as given, text through the tokenizer (with
// the post-processor's special tokens unless --no-special-tokens), or a
// conversation through the chat template (which writes its own special
// tokens, so none are added: transformers' apply_chat_template(tokenize=True)).
std::optional<Tokenizer> load_prompt(const ModelRunConfig& c, const TextOptions& t, GenerationRequest& request) {
  check_chat_options(t.chat);
  int given = (!c.prompt_ids.empty()) + t.prompt.has_value() + (!t.prompt_file.empty()) +
              (!t.chat.messages_file.empty()) + (!t.prompts_file.empty());
  LS_REQUIRE(given == 1, ErrorKind::kInvalidArgument,
             "give exactly one of --prompt-ids, --prompt, --prompt-file, --messages, --prompts-file");
  LS_REQUIRE(!t.chat.chat || t.text(), ErrorKind::kInvalidArgument, "--chat needs --prompt, --prompt-file or --messages");
  if (!t.text()) {
    request.prompt = parse_id_list(c.prompt_ids, "--prompt-ids");
    return std::nullopt;
  }
  Tokenizer tokenizer = load_tokenizer(c.engine.model_dir, t.tokenizer);
  std::optional<std::string> text = t.prompt;
  if (!t.prompt_file.empty()) text = read_prompt_file(t.prompt_file);
  if (t.chat.active()) {
    const std::string rendered = render_chat(t.chat, c.engine.model_dir, text);
    spdlog::debug("chat prompt: {}", rendered);
    request.prompt = tokenizer.encode(rendered);
    return tokenizer;
  }
  request.prompt = tokenizer.encode(*text);
  if (!t.no_special_tokens) request.prompt = tokenizer.with_special_tokens(request.prompt);
  return tokenizer;
}

// The keys a --prompts-file line is read for.
constexpr const char* kPromptsFileKeys[] = {"prompt", "prompt_ids", "messages", "max_new_tokens", "temperature",
                                            "top_k", "top_p", "seed", "stop"};

// A --prompts-file line's integer setting `key`, in [lo, hi]: an integral
// JSON number (1.0 included), never a fraction or a value beyond the range.
int64_t line_integer(const nlohmann::ordered_json& line, const char* key, int64_t lo, int64_t hi) {
  const nlohmann::ordered_json& v = line[key];
  const bool integral = v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                                  std::floor(v.get<double>()) == v.get<double>());
  LS_REQUIRE(integral, ErrorKind::kInvalidArgument, "\"{}\" must be an integer, got {}", key, v.dump());
  const double d = v.get<double>();
  LS_REQUIRE(d >= static_cast<double>(lo) && d <= static_cast<double>(hi), ErrorKind::kInvalidArgument,
             "\"{}\" must be in [{}, {}], got {}", key, lo, hi, v.dump());
  return v.is_number_unsigned() ? static_cast<int64_t>(v.get<uint64_t>())
                                : (v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(d));
}

// A --prompts-file line's number setting `key` (its range is checked with the rest).
double line_number(const nlohmann::ordered_json& line, const char* key) {
  const nlohmann::ordered_json& v = line[key];
  LS_REQUIRE(v.is_number(), ErrorKind::kInvalidArgument, "\"{}\" must be a number, got {}", key, v.dump());
  return v.get<double>();
}

// A --prompts-file line's own settings over the command line's.
GenerationRequest request_settings(const nlohmann::ordered_json& line, const GenerationRequest& shared,
                                   const std::string& where) {
  GenerationRequest r = shared;
  try {
    // Other keys (a dataset's "id", a misspelt setting) are left out, as
    // vLLM's server leaves out unknown fields, and named so a typo shows.
    for (const auto& [key, value] : line.items())
      if (world().rank == 0 && std::find_if(std::begin(kPromptsFileKeys), std::end(kPromptsFileKeys),
                                            [&](const char* k) { return key == k; }) == std::end(kPromptsFileKeys))
        spdlog::warn("{}: key \"{}\" is not used (known: {})", where, key, fmt::join(kPromptsFileKeys, ", "));
    constexpr int64_t kMost = int64_t{1} << 53;  // exact in a JSON double
    if (line.contains("max_new_tokens")) r.max_new_tokens = line_integer(line, "max_new_tokens", 1, kMost);
    if (line.contains("temperature")) r.sampling.temperature = line_number(line, "temperature");
    if (line.contains("top_k")) r.sampling.top_k = line_integer(line, "top_k", 0, kMost);
    if (line.contains("top_p")) r.sampling.top_p = line_number(line, "top_p");
    if (line.contains("seed")) {
      LS_REQUIRE(line["seed"].is_number_unsigned(), ErrorKind::kInvalidArgument,
                 "\"seed\" must be an integer >= 0, got {}", line["seed"].dump());
      r.sampling.seed = line["seed"].get<uint64_t>();
    }
    r.sampling.validate();
  } catch (const nlohmann::json::exception& e) {
    LS_FAIL(ErrorKind::kInvalidArgument, "{}: a setting has the wrong type: {}", where, e.what());
  } catch (const Error& e) {
    LS_FAIL(ErrorKind::kInvalidArgument, "{}: {}", where, e.what());
  }
  return r;
}

// A --prompts-file line's "stop" (a string or a list of strings) over the
// command line's --stop.
std::vector<std::string> line_stop_strings(const nlohmann::ordered_json& line, const std::vector<std::string>& shared,
                                           const std::string& where) {
  if (!line.contains("stop")) return shared;
  const nlohmann::ordered_json& stop = line["stop"];
  std::vector<std::string> stops;
  const auto take = [&](const nlohmann::ordered_json& s) {
    LS_REQUIRE(s.is_string(), ErrorKind::kInvalidArgument,
               "{}: \"stop\" must be a string or a list of strings, got {}", where, stop.dump());
    stops.push_back(s.get<std::string>());
  };
  if (stop.is_array()) {
    for (const auto& s : stop) take(s);
  } else {
    take(stop);
  }
  try {
    check_stop_strings(stops);
  } catch (const Error& e) {
    LS_FAIL(e.kind(), "{}: \"stop\": {}", where, e.what());
  }
  return stops;
}

// A --prompts-file line's prompt: its "prompt_ids", or its "messages" or
// "prompt" tokenized (through the chat template where asked).
void encode_prompt_line(const ModelRunConfig& c, const TextOptions& t, const nlohmann::ordered_json& line,
                        std::optional<Tokenizer>& tokenizer, std::vector<int32_t>& prompt) {
  if (line.contains("prompt_ids")) {
    LS_REQUIRE(line["prompt_ids"].is_array(), ErrorKind::kInvalidArgument, "prompt_ids must be a list");
    for (const auto& id : line["prompt_ids"]) {
      LS_REQUIRE(id.is_number_integer() && id.get<int64_t>() >= INT32_MIN && id.get<int64_t>() <= INT32_MAX,
                 ErrorKind::kInvalidArgument, "prompt_ids must be a list of token ids");
      prompt.push_back(id.get<int32_t>());
    }
    return;
  }
  if (!tokenizer) tokenizer.emplace(load_tokenizer(c.engine.model_dir, t.tokenizer));
  if (line.contains("messages")) {
    check_messages(line["messages"], "\"messages\"");  // as --messages checks its file
    prompt = tokenizer->encode(render_conversation(t.chat, c.engine.model_dir, line["messages"]));
    return;
  }
  LS_REQUIRE(line["prompt"].is_string(), ErrorKind::kInvalidArgument, "prompt must be a string");
  const std::string text_prompt = line["prompt"].get<std::string>();
  if (t.chat.chat) {
    prompt = tokenizer->encode(render_chat(t.chat, c.engine.model_dir, text_prompt));
  } else {
    prompt = tokenizer->encode(text_prompt);
    if (!t.no_special_tokens) prompt = tokenizer->with_special_tokens(prompt);
  }
}

struct PromptsFile {
  std::vector<GenerationRequest> requests;
  std::vector<int> lines;  // each request's line in the file
  std::vector<std::vector<std::string>> stop_strings;  // each request's
  // Runs `f`, naming request i's line in what it throws.
  template <typename F>
  void at_line(const std::string& file, size_t i, F f) const {
    try {
      f();
    } catch (const Error& e) {
      LS_FAIL(e.kind(), "--prompts-file {} line {}: {}", file, lines[i], e.what());
    }
  }
};

// --prompts-file: one request a line, a JSON object holding "prompt" (text,
// taken as --prompt is, --chat, --system and --no-special-tokens included),
// "prompt_ids" (a list of ids) or "messages" (a conversation, as --messages);
// blank lines skipped; optional "max_new_tokens", "temperature", "top_k",
// "top_p", "seed", "stop" override the command line's for that request. The
// requests in order, their sampling bits drawn for their line's index (so
// they do not depend on which requests share a step).
PromptsFile read_prompts_file(const ModelRunConfig& c, const TextOptions& t, const GenerationRequest& shared,
                              const std::vector<std::string>& shared_stops, std::optional<Tokenizer>& tokenizer) {
  std::istringstream in(read_whole_file(t.prompts_file, "--prompts-file"));
  PromptsFile file;
  std::vector<GenerationRequest>& requests = file.requests;
  std::string text;
  for (int number = 1; std::getline(in, text); ++number) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto where = [&] { return fmt::format("--prompts-file {} line {}", t.prompts_file, number); };
    const nlohmann::ordered_json line = parse_template_json(text, where());
    const int kinds = line.is_object() ? static_cast<int>(line.contains("prompt")) + line.contains("prompt_ids") +
                                             line.contains("messages")
                                       : 0;
    LS_REQUIRE(kinds == 1, ErrorKind::kInvalidArgument,
               "{}: expected an object with one of \"prompt\", \"prompt_ids\", \"messages\"", where());
    requests.push_back(request_settings(line, shared, where()));
    file.stop_strings.push_back(line_stop_strings(line, shared_stops, where()));
    requests.back().sampling_sequence = static_cast<int64_t>(requests.size() - 1);
    file.lines.push_back(number);
    file.at_line(t.prompts_file, requests.size() - 1,
                 [&] { encode_prompt_line(c, t, line, tokenizer, requests.back().prompt); });
  }
  LS_REQUIRE(!requests.empty(), ErrorKind::kInvalidArgument, "--prompts-file {} holds no prompts", t.prompts_file);
  return file;
}

// Each request's text, with its stop strings (none without a tokenizer: a
// file of "prompt_ids" lines and no stop strings prints ids alone). Stop
// strings are matched in the text, so "prompt_ids" lines with them load the
// tokenizer too.
std::vector<StopStringStream> text_streams(const ModelRunConfig& c, const TextOptions& t,
                                           const std::vector<std::vector<std::string>>& stops,
                                           std::optional<Tokenizer>& tokenizer) {
  if (!tokenizer && std::any_of(stops.begin(), stops.end(), [](const auto& s) { return !s.empty(); }))
    tokenizer.emplace(load_tokenizer(c.engine.model_dir, t.tokenizer));
  std::vector<StopStringStream> texts;
  if (tokenizer)
    for (const auto& request_stops : stops) texts.emplace_back(*tokenizer, request_stops);
  return texts;
}

// Every rank must run the same command on the same requests: ranks that read
// different prompts (a file that reads differently on each, a job launched
// with different arguments) would enter collectives of different sizes.
// Checked before the engine's first step, with one small all-gather behind a
// barrier (which waits as long as start-up may take: ranks arrive out of step).
void require_same_requests_on_all_ranks(std::string_view command, const std::vector<GenerationRequest>& requests) {
  uint64_t h = fnv1a(kFnvOffset, command.data(), command.size());
  for (const GenerationRequest& r : requests) {
    const uint64_t n = r.prompt.size();
    h = fnv1a(h, &n, sizeof n);
    h = fnv1a(h, r.prompt.data(), r.prompt.size() * sizeof(int32_t));
    h = fnv1a(h, &r.max_new_tokens, sizeof r.max_new_tokens);
    const SamplingParams& s = r.sampling;
    for (const void* field : {static_cast<const void*>(&s.temperature), static_cast<const void*>(&s.top_k),
                              static_cast<const void*>(&s.top_p), static_cast<const void*>(&s.seed)})
      h = fnv1a(h, field, 8);
  }
  world().comm->barrier();
  verify_same_on_all_ranks(*world().comm, h, "the command and its requests' checksum (prompt ids and settings)");
}

// Runs the requests of --prompts-file with --max-batch sequences at once
// (default: all of them, up to 32; a request takes a slot as one frees up),
// printing one JSON line per request in the file's order, each as soon as it
// and those before it are done: {"index", "ids", "text" (when a tokenizer was
// used; special tokens left out, as in the streamed text, and cut before a
// stop string), "stopped"}.
int run_generate_batch(ModelRunConfig& c, const GenerationRequest& base, const StopOptions& stop,
                       const TextOptions& text) {
  LS_REQUIRE(c.dump_logits.empty(), ErrorKind::kInvalidArgument, "--dump-logits takes one prompt, not --prompts-file");
  check_chat_options(text.chat);
  LS_REQUIRE(text.chat.messages_file.empty(), ErrorKind::kInvalidArgument,
             "give exactly one of --prompt-ids, --prompt, --prompt-file, --messages, --prompts-file");
  std::optional<Tokenizer> tokenizer;
  PromptsFile file = read_prompts_file(c, text, base, stop.strings, tokenizer);
  std::vector<GenerationRequest>& requests = file.requests;
  std::vector<StopStringStream> texts = text_streams(c, text, file.stop_strings, tokenizer);
  for (size_t r = 0; r < texts.size(); ++r) stop_on_strings(requests[r], texts[r]);
  if (c.max_batch_option == nullptr || c.max_batch_option->count() == 0)
    c.engine.max_batch = std::min<int64_t>(static_cast<int64_t>(requests.size()), 32);
  require_same_requests_on_all_ranks("generate", requests);
  log_start("generate", c);
  Engine engine(c.engine, *world().comm);
  const std::vector<int32_t> stop_ids = resolve_stop_ids(stop, engine.config());
  for (GenerationRequest& r : requests) r.stop_ids = stop_ids;
  Generator generator(engine.group(), !c.engine.sync_steps);
  for (size_t i = 0; i < requests.size(); ++i)
    file.at_line(text.prompts_file, i, [&] { generator.check(requests[i]); });  // before any step
  std::vector<std::optional<nlohmann::ordered_json>> lines(requests.size());
  size_t printed = 0;
  generator.set_prefix_reuse(!text.no_prefix_reuse);
  GenerationClock clock;
  int64_t generated = 0;
  auto on_token = [&](size_t, int32_t) { clock.token(), ++generated; };
  generator.generate(requests, false, on_token, [&](size_t r, const GenerationOutput& out) {
    nlohmann::ordered_json& line = lines[r].emplace(nlohmann::ordered_json{{"index", r}, {"ids", out.tokens}});
    if (tokenizer) {
      texts[r].take_rest();
      line["text"] = texts[r].text();
    }
    line["stopped"] = out.stopped;
    for (; printed < lines.size() && lines[printed] && world().rank == 0; ++printed) {
      std::cout << lines[printed]->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
      require_stdout_written();
    }
  });
  int64_t prompt_tokens = 0, reused = 0;
  for (size_t r = 0; r < requests.size(); ++r) {
    prompt_tokens += static_cast<int64_t>(requests[r].prompt.size());
    reused += generator.reused_prompt_tokens()[r];
  }
  spdlog::info("{} requests: {} prompt tokens, {} of them found in the KV cache (a prefix another request prefilled)",
               requests.size(), prompt_tokens, reused);
  spdlog::info("{} tokens generated {}", generated, clock.throughput(generated));
  return 0;
}

int run_generate(ModelRunConfig& c, GenerationRequest& request, const StopOptions& stop, const TextOptions& text) {
  c.engine.diag = Diagnostics::parse(c.diag);
  c.engine.collective_timeout_s = world().collective_timeout_s;
  request.sampling.validate();
  check_stop_option(stop);
  if (!text.prompts_file.empty() && c.prompt_ids.empty() && !text.prompt && text.prompt_file.empty())
    return run_generate_batch(c, request, stop, text);
  std::optional<Tokenizer> tokenizer = load_prompt(c, text, request);
  LS_REQUIRE(tokenizer || stop.strings.empty(), ErrorKind::kInvalidArgument,
             "--stop needs a text prompt (--prompt, --prompt-file, --messages or --prompts-file), not --prompt-ids");
  if (world().rank == 0 && !c.dump_logits.empty()) require_output_path(c.dump_logits, "--dump-logits");
  require_same_requests_on_all_ranks("generate", {request});
  log_start("generate", c);
  Engine engine(c.engine, *world().comm);
  request.stop_ids = resolve_stop_ids(stop, engine.config());
  Generator generator(engine.group(), !c.engine.sync_steps);
  const bool keep_logits = !c.dump_logits.empty();
  // Every rank follows the text (to stop alike on a stop string); rank 0
  // streams it as tokens arrive, holding back incomplete UTF-8 and what may
  // be the start of a stop string. Special tokens (an eos, <|im_end|>) are
  // not shown, as vLLM and transformers' skip_special_tokens do.
  std::optional<StopStringStream> stream;
  if (tokenizer) stop_on_strings(request, stream.emplace(*tokenizer, stop.strings));
  GenerationClock clock;
  auto on_token = [&](size_t, int32_t) {
    clock.token();
    if (stream && world().rank == 0) {
      std::cout << stream->take_ready() << std::flush;
      require_stdout_written();
    }
  };
  std::vector<GenerationOutput> out = generator.generate({request}, keep_logits, on_token);
  const std::string speed =  // before the output is written (a --dump-logits file may take long)
      clock.summary(static_cast<int64_t>(request.prompt.size()), static_cast<int64_t>(out[0].tokens.size()));
  if (world().rank == 0) {
    if (stream) std::cout << stream->take_rest() << std::endl;
    else std::cout << fmt::format("{}", fmt::join(out[0].tokens, " ")) << std::endl;
    if (keep_logits)
      write_npy_f32(c.dump_logits, {static_cast<int64_t>(out[0].tokens.size()), engine.config().vocab_size},
                    out[0].logits.data());
  }
  spdlog::info("prompt {} tokens, {} generated: {}", request.prompt.size(), out[0].tokens.size(), speed);
  return 0;
}

int run_score(ModelRunConfig& c) {
  c.engine.diag = Diagnostics::parse(c.diag);
  c.engine.collective_timeout_s = world().collective_timeout_s;
  std::vector<int32_t> prompt = parse_id_list(c.prompt_ids, "--prompt-ids");
  if (world().rank == 0) require_output_path(c.dump_logits, "--dump-logits");
  require_same_requests_on_all_ranks("score", {GenerationRequest{.prompt = prompt, .max_new_tokens = 0}});
  log_start("score", c);
  Engine engine(c.engine, *world().comm);
  Generator generator(engine.group());
  std::vector<float> logits = generator.score(prompt);
  const auto bad = std::find_if(logits.begin(), logits.end(), [](float v) { return !std::isfinite(v); });
  const int64_t vocab = engine.config().vocab_size;
  LS_REQUIRE(bad == logits.end(), ErrorKind::kModel,
             "logit {} of prompt position {} is {}: the model's weights or config give non-finite values",
             (bad - logits.begin()) % vocab, (bad - logits.begin()) / vocab, *bad);
  if (world().rank == 0)
    write_npy_f32(c.dump_logits, {static_cast<int64_t>(prompt.size()), engine.config().vocab_size}, logits.data());
  return 0;
}

}  // namespace

void add_model_commands(CLI::App& root, CommandTable& table) {
  auto gen = std::make_shared<ModelRunConfig>();
  auto request = std::make_shared<GenerationRequest>();
  auto stop = std::make_shared<StopOptions>();
  auto text = std::make_shared<TextOptions>();
  CLI::App* g = root.add_subcommand("generate", "generate tokens after a prompt");
  add_engine_options(g, *gen);
  g->add_option("--prompt-ids", gen->prompt_ids, "comma-separated prompt token ids, e.g. 1,2,3 (prints ids)");
  g->add_option("--prompt", text->prompt, "prompt text (streams text out)");
  g->add_option("--prompt-file", text->prompt_file, "file holding the prompt text");
  g->add_option("--prompts-file", text->prompts_file,
                "many requests, --max-batch at once (default all, up to 32; continuous batching): a JSON object a "
                "line with \"prompt\", \"prompt_ids\" or \"messages\"; prints a JSON line per request, in order");
  g->add_option("--tokenizer", text->tokenizer, "tokenizer.json (default: the model folder's)");
  g->add_flag("--no-special-tokens", text->no_special_tokens,
              "--prompt: no special tokens around the text (default: those of the tokenizer's post-processor, "
              "e.g. a BOS)");
  add_chat_options(g, text->chat, true);
  g->add_flag("--no-prefix-reuse", text->no_prefix_reuse,
              "--prompts-file: prefill every prompt whole (by default a prompt prefix that another request "
              "prefilled is copied from its KV cache; on a GPU in bf16 that can turn near-ties)");
  g->add_flag("--sync-steps", gen->engine.sync_steps,
              "queue each decode step only once the last one's tokens are in (default: one step ahead)");
  add_generation_options(g, *request, *stop, true);
  g->add_option("--dump-logits", gen->dump_logits, "write [generated, vocab] float32 logits to this .npy");
  table.add(g, [gen, request, stop, text] { return run_generate(*gen, *request, *stop, *text); });

  auto sc = std::make_shared<ModelRunConfig>();
  CLI::App* s = root.add_subcommand("score", "teacher-forced logits of every prompt position");
  add_engine_options(s, *sc);
  s->add_option("--prompt-ids", sc->prompt_ids, "comma-separated prompt token ids")->required();
  s->add_option("--dump-logits", sc->dump_logits, "write [prompt, vocab] float32 logits to this .npy")->required();
  table.add(s, [sc] { return run_score(*sc); });
}

}  // namespace lockstep::cli
