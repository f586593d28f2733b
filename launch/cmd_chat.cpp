// Chat options shared by `generate` and `apply-chat-template`, and two
// subcommands:
//
//   lockstep apply-chat-template --model DIR --prompt "Hi" [--system S]
//   lockstep apply-chat-template --model DIR --messages chat.json [--no-generation-prompt]
//
// prints the model's chat template rendered over the conversation, as
// transformers' apply_chat_template(tokenize=False) does, nothing added;
//
//   [mpirun -np N] lockstep chat --model DIR [--system S]
//
// a conversation on standard input: each line a user turn, each reply
// streamed as it is generated; /reset starts again, /exit (or the end of
// the input) ends. Under mpirun, rank 0 reads and every rank generates.
// Each turn prefills only what follows the tokens its KV cache holds from
// the turn before (Generator::set_prefix_reuse).
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "common/error.h"
#include "common/utf8.h"
#include "engine/generate.h"
#include "launch/commands.h"
#include "launch/generation_clock.h"
#include "launch/world.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace lockstep::cli {

void add_chat_options(CLI::App* cmd, ChatOptions& c, bool chat_flag) {
  if (chat_flag)
    cmd->add_flag("--chat", c.chat,
                  "--prompt / --prompt-file is a user message: render the model's chat template around it "
                  "(chat_template.jinja or tokenizer_config.json) and add no other special tokens");
  cmd->add_option("--system", c.system, "a system message before the user's");
  cmd->add_option("--messages", c.messages_file,
                  "a JSON file holding the conversation, [{\"role\": \"user\", \"content\": \"...\"}, ...] "
                  "(implies --chat)");
  cmd->add_option("--chat-template", c.template_file, "a Jinja chat template file instead of the model's");
  cmd->add_option("--chat-template-kwargs", c.template_kwargs,
                  "extra template variables as a JSON object, e.g. '{\"enable_thinking\": false}'");
}

std::string render_chat(const ChatOptions& c, const std::filesystem::path& model_dir,
                        const std::optional<std::string>& user_text) {
  LS_REQUIRE(c.active(), ErrorKind::kInternal, "render_chat without --chat");
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!c.messages_file.empty()) {
    LS_REQUIRE(!user_text && c.system.empty(), ErrorKind::kInvalidArgument,
               "--messages holds the whole conversation: give no --prompt, --prompt-file or --system with it");
    messages = read_messages_file(c.messages_file);
  } else {
    LS_REQUIRE(user_text.has_value(), ErrorKind::kInvalidArgument, "--chat needs --prompt, --prompt-file or --messages");
    if (!c.system.empty()) messages.push_back({{"role", "system"}, {"content", c.system}});
    messages.push_back({{"role", "user"}, {"content", *user_text}});
  }
  return render_conversation(c, model_dir, messages);
}

ChatTemplate load_chat_template(const ChatOptions& c, const std::filesystem::path& model_dir) {
  return c.template_file.empty() ? ChatTemplate::load(model_dir) : ChatTemplate::load_file(c.template_file, model_dir);
}

std::string render_conversation(const ChatOptions& c, const std::filesystem::path& model_dir,
                                const nlohmann::ordered_json& messages) {
  ChatRenderOptions options;
  options.add_generation_prompt = !c.no_generation_prompt;
  if (!c.template_kwargs.empty()) {
    options.variables = parse_template_json(c.template_kwargs, "--chat-template-kwargs");
    LS_REQUIRE(options.variables.is_object(), ErrorKind::kInvalidArgument,
               "--chat-template-kwargs must be a JSON object, got {}", c.template_kwargs);
  }
  return load_chat_template(c, model_dir).render(messages, options);
}

void check_chat_options(const ChatOptions& c) {
  LS_REQUIRE(c.active() || (c.system.empty() && c.template_file.empty() && c.template_kwargs.empty()),
             ErrorKind::kInvalidArgument, "--system, --chat-template and --chat-template-kwargs need --chat or --messages");
}

namespace {

struct ApplyOptions {
  std::string model_dir;
  std::optional<std::string> prompt;
  ChatOptions chat;
};

int run_apply(const ApplyOptions& o) {
  ChatOptions chat = o.chat;
  chat.chat = true;
  LS_REQUIRE(o.prompt.has_value() || !chat.messages_file.empty(), ErrorKind::kInvalidArgument,
             "apply-chat-template needs --prompt or --messages");
  const std::string text = render_chat(chat, o.model_dir, o.prompt);
  const size_t written = std::fwrite(text.data(), 1, text.size(), stdout);
  LS_REQUIRE(written == text.size() && std::fflush(stdout) == 0, ErrorKind::kIo, "cannot write to standard output");
  return 0;
}

struct ChatSession {
  ModelRunConfig model;
  ChatOptions chat;
  std::string tokenizer;
  GenerationRequest request;
  StopOptions stop;
  bool no_prefix_reuse = false;
};

constexpr int64_t kMaxLineBytes = int64_t{64} << 20;
constexpr int64_t kEnd = -1, kReadError = -2, kTooLong = -3;  // the line's length, or why there is none

// One line of standard input without its newline: its length, kEnd at the
// end of the input, kReadError, or kTooLong past kMaxLineBytes.
int64_t read_line(std::string& line) {
  line.clear();
  for (int c; (c = std::getc(stdin)) != EOF;) {
    if (c == '\n') {
      if (!line.empty() && line.back() == '\r') line.pop_back();  // a CRLF line ending
      return static_cast<int64_t>(line.size());
    }
    if (static_cast<int64_t>(line.size()) == kMaxLineBytes) return kTooLong;
    line.push_back(static_cast<char>(c));
  }
  if (std::ferror(stdin)) return kReadError;
  return line.empty() ? kEnd : static_cast<int64_t>(line.size());  // a last line without a newline
}

// The next user line, read by rank 0 and sent to every rank; nullopt at the
// end of the input or /exit. The other ranks wait without a deadline.
std::optional<std::string> next_user_line(Communicator& comm) {
  std::string line;
  int64_t length = kEnd;
  if (comm.rank() == 0) {
    if (::isatty(STDIN_FILENO)) std::cout << "> " << std::flush;
    length = read_line(line);
    if (length >= 0 && (line == "/exit" || line == "/quit")) length = kEnd;
  }
  comm.broadcast_unhurried(&length, sizeof(length), 0);
  LS_REQUIRE(length != kReadError, ErrorKind::kIo, "cannot read standard input");
  LS_REQUIRE(length != kTooLong, ErrorKind::kInvalidArgument, "a chat line is longer than {} bytes", kMaxLineBytes);
  if (length < 0) return std::nullopt;
  line.resize(static_cast<size_t>(length));
  if (length > 0) comm.broadcast(line.data(), length, 0);
  return line;
}

// The session's speed, logged at its end as llama.cpp's chat prints its
// timings at exit: the prompt tokens each turn prefilled and the time to its
// first token, then the tokens after the first and the time they took (the
// time spent waiting for input left out).
class ChatSpeed {
 public:
  void add_turn(int64_t prefilled, int64_t reused, int64_t generated, const GenerationClock& clock) {
    ++turns_, prefilled_ += prefilled, reused_ += reused;
    const std::optional<double> first = clock.seconds_to_first();
    if (!first) return;
    to_first_ += *first, later_tokens_ += generated - 1, after_first_ += clock.seconds_after_first();
  }
  std::string summary() const {
    std::string s = fmt::format("{} turns: {} prompt tokens prefilled ({} more found in the KV cache), the first "
                                "tokens after {:.1f} ms in all",
                                turns_, prefilled_, reused_, 1e3 * to_first_);
    if (to_first_ > 0) s += fmt::format(" ({:.1f} prompt tok/s)", static_cast<double>(prefilled_) / to_first_);
    if (after_first_ > 0)
      s += fmt::format("; {} more tokens in {:.1f} ms ({:.1f} tok/s)", later_tokens_, 1e3 * after_first_,
                       static_cast<double>(later_tokens_) / after_first_);
    return s;
  }
  bool empty() const { return turns_ == 0; }

 private:
  int64_t turns_ = 0, prefilled_ = 0, reused_ = 0, later_tokens_ = 0;
  double to_first_ = 0.0, after_first_ = 0.0;
};

int run_chat(ChatSession& s) {
  s.model.engine.diag = Diagnostics::parse(s.model.diag);
  s.model.engine.collective_timeout_s = world().collective_timeout_s;
  s.request.sampling.validate();
  check_stop_option(s.stop);
  LS_REQUIRE(s.request.max_new_tokens > 0, ErrorKind::kInvalidArgument, "--max-new-tokens must be > 0, got {}",
             s.request.max_new_tokens);
  const Tokenizer tokenizer = load_tokenizer(s.model.engine.model_dir, s.tokenizer);
  s.chat.chat = true;
  nlohmann::ordered_json start = nlohmann::ordered_json::array();
  if (!s.chat.messages_file.empty()) start = read_messages_file(s.chat.messages_file);
  if (!s.chat.system.empty()) start.insert(start.begin(), {{"role", "system"}, {"content", s.chat.system}});
  load_chat_template(s.chat, s.model.engine.model_dir);  // a missing or malformed template fails before the weights load
  log_start("chat", s.model);
  Engine engine(s.model.engine, *world().comm);
  const std::vector<int32_t> stop = resolve_stop_ids(s.stop, engine.config());
  Generator generator(engine.group(), !s.model.engine.sync_steps);
  generator.set_prefix_reuse(!s.no_prefix_reuse);
  const int64_t context = engine.group().runner().limits().max_seq;
  nlohmann::ordered_json messages = start;
  int64_t refused = 0;  // turns that did not fit or were not UTF-8: the exit status says so when input is piped
  ChatSpeed speed;
  for (int64_t turn = 0;; ++turn) {
    std::optional<std::string> line = next_user_line(*world().comm);
    if (!line) break;
    if (*line == "/reset") {
      messages = start;
      continue;
    }
    if (const size_t bad = find_invalid_utf8(*line); bad != std::string::npos) {  // the same line on every rank
      if (world().rank == 0)
        spdlog::error("chat line {} is not valid UTF-8 (byte offset {}): the turn is skipped", turn + 1, bad);
      ++refused;
      continue;
    }
    messages.push_back({{"role", "user"}, {"content", *line}});
    GenerationRequest r = s.request;
    r.prompt = tokenizer.encode(render_conversation(s.chat, s.model.engine.model_dir, messages));
    r.stop_ids = stop;
    r.sampling_sequence = turn;
    r.max_new_tokens = std::min(r.max_new_tokens, context - static_cast<int64_t>(r.prompt.size()));
    if (r.max_new_tokens <= 0) {  // every rank sees the same lengths, so every rank skips the turn
      if (world().rank == 0)
        spdlog::error("the conversation ({} tokens) fills the context ({}): /reset to start again", r.prompt.size(),
                      context);
      messages.erase(messages.end() - 1);
      ++refused;
      continue;
    }
    // The reply as text on every rank (valid UTF-8, special tokens left out,
    // ended before a stop string), streamed by rank 0. What the conversation
    // keeps is that text, as for a reply ended by an eos; the next turn's
    // prompt, rendered from it, then reuses the cache only as far as its
    // tokens match the ones generated.
    StopStringStream reply(tokenizer, s.stop.strings);
    stop_on_strings(r, reply);
    GenerationClock clock;
    int64_t generated = 0;
    generator.generate({r}, false, [&](size_t, int32_t) {
      clock.token(), ++generated;
      if (world().rank == 0) {
        std::cout << reply.take_ready() << std::flush;
        require_stdout_written();
      }
    });
    const int64_t reused = generator.reused_prompt_tokens()[0];
    spdlog::debug("turn {}: {} prompt tokens, {} of them from the KV cache", turn + 1, r.prompt.size(), reused);
    speed.add_turn(static_cast<int64_t>(r.prompt.size()) - reused, reused, generated, clock);
    const std::string tail = reply.take_rest();
    if (world().rank == 0) {
      std::cout << tail << std::endl;
      require_stdout_written();
    }
    messages.push_back({{"role", "assistant"}, {"content", reply.text()}});
  }
  if (!speed.empty()) spdlog::info("{}", speed.summary());
  return refused == 0 ? 0 : 1;
}

}  // namespace

void add_chat_command(CLI::App& root, CommandTable& table) {
  auto session = std::make_shared<ChatSession>();
  CLI::App* c = root.add_subcommand("chat", "a conversation on standard input, one line a user turn");
  add_engine_options(c, session->model);
  add_chat_options(c, session->chat, false);
  c->add_option("--tokenizer", session->tokenizer, "tokenizer.json (default: the model folder's)");
  session->request.max_new_tokens = 512;
  add_generation_options(c, session->request, session->stop, false);  // a reply: fewer tokens when the context fills
  c->add_flag("--sync-steps", session->model.engine.sync_steps, "queue each decode step only once the last one's tokens are in");
  c->add_flag("--no-prefix-reuse", session->no_prefix_reuse,
              "prefill the whole conversation every turn (by default a turn prefills only what follows the "
              "tokens already in the KV cache; on the GPU in bf16 that can turn near-ties)");
  table.add(c, [session] { return run_chat(*session); });

  auto o = std::make_shared<ApplyOptions>();
  CLI::App* a = root.add_subcommand("apply-chat-template",
                                    "print the model's chat template rendered over a conversation");
  a->add_option("--model", o->model_dir, "Hugging Face model folder (its chat template and special tokens)")
      ->required();
  a->add_option("--prompt", o->prompt, "a user message");
  add_chat_options(a, o->chat, false);
  a->add_flag("--no-generation-prompt", o->chat.no_generation_prompt,
              "render without the assistant header that asks for a reply (add_generation_prompt false)");
  table.add(a, [o] { return run_apply(*o); });
}

}  // namespace lockstep::cli
