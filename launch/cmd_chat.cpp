// Chat options shared by `generate` and `apply-chat-template`, and the
// `apply-chat-template` subcommand itself:
//
//   lockstep apply-chat-template --model DIR --prompt "Hi" [--system S]
//   lockstep apply-chat-template --model DIR --messages chat.json [--no-generation-prompt]
//
// prints the model's chat template rendered over the conversation, as
// transformers' apply_chat_template(tokenize=False) does, nothing added.
#include <cstdio>
#include <memory>

#include "common/error.h"
#include "launch/commands.h"
#include "tokenizer/chat_template.h"

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

std::string render_conversation(const ChatOptions& c, const std::filesystem::path& model_dir,
                                const nlohmann::ordered_json& messages) {
  ChatRenderOptions options;
  options.add_generation_prompt = !c.no_generation_prompt;
  if (!c.template_kwargs.empty()) {
    try {
      options.variables = nlohmann::ordered_json::parse(c.template_kwargs);
    } catch (const nlohmann::json::exception& e) {
      LS_FAIL(ErrorKind::kInvalidArgument, "--chat-template-kwargs is not valid JSON: {}", e.what());
    }
    LS_REQUIRE(options.variables.is_object(), ErrorKind::kInvalidArgument,
               "--chat-template-kwargs must be a JSON object, got {}", c.template_kwargs);
  }
  const ChatTemplate chat_template =
      c.template_file.empty() ? ChatTemplate::load(model_dir) : ChatTemplate::load_file(c.template_file, model_dir);
  return chat_template.render(messages, options);
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
  const std::string text = render_chat(chat, o.model_dir, o.prompt);
  const size_t written = std::fwrite(text.data(), 1, text.size(), stdout);
  LS_REQUIRE(written == text.size() && std::fflush(stdout) == 0, ErrorKind::kIo, "cannot write to standard output");
  return 0;
}

}  // namespace

void add_chat_command(CLI::App& root, CommandTable& table) {
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
