// `lockstep tokenize` and `lockstep detokenize`.
//
//   lockstep tokenize --tokenizer FILE|DIR --text-file F    ids of F's whole content
//   lockstep detokenize --tokenizer FILE|DIR --ids 1 2 3    the text of the ids
//
// tokenize adds no special tokens (special-token text inside F is matched) and
// prints the ids space-separated on one line; detokenize writes the raw bytes
// of the tokens as Hugging Face's decode gives them (special tokens kept, the
// decoder's leading space dropped), nothing added, so detokenize(tokenize(F))
// is F (NFC-normalized where the tokenizer normalizes; where F starts with
// spaces, less those a Metaspace decoder drops from the first token).
#include <fmt/ranges.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>

#include "common/error.h"
#include "common/file.h"
#include "launch/commands.h"
#include "tokenizer/tokenizer.h"

namespace lockstep::cli {
namespace {

struct TokenizeOptions {
  std::string tokenizer;
  std::string text_file;
  bool special_tokens = false;
};

struct DetokenizeOptions {
  std::string tokenizer;
  std::vector<std::string> ids;
};

std::string read_text_file(const std::string& path) {
  if (path == "-") {
    return read_standard_input("--text-file -");
  }
  return read_whole_file(path, "--text-file");
}

// Ids given as separate arguments and/or separated by commas or spaces; an
// empty item between commas, or no id at all, is refused.
std::vector<int32_t> parse_ids(const std::vector<std::string>& args) {
  std::vector<int32_t> ids;
  for (const std::string& arg : args) {
    const bool commas = arg.find(',') != std::string::npos;
    for (size_t start = 0; start <= arg.size();) {
      const size_t comma = std::min(arg.find(',', start), arg.size());
      std::istringstream words(arg.substr(start, comma - start));
      start = comma + 1;
      std::string word;
      bool any = false;
      while (words >> word) {
        any = true;
        const std::optional<long long> value = whole_integer(word);
        LS_REQUIRE(value && *value >= 0 && *value <= INT32_MAX, ErrorKind::kInvalidArgument,
                   "--ids: '{}' is not a token id", word);
        ids.push_back(static_cast<int32_t>(*value));
      }
      LS_REQUIRE(any || !commas, ErrorKind::kInvalidArgument, "--ids: an empty item in '{}'", arg);
    }
  }
  LS_REQUIRE(!ids.empty(), ErrorKind::kInvalidArgument, "--ids holds no token ids");
  return ids;
}

void write_stdout(const std::string& bytes) {
  size_t written = std::fwrite(bytes.data(), 1, bytes.size(), stdout);
  LS_REQUIRE(written == bytes.size() && std::fflush(stdout) == 0, ErrorKind::kIo,
             "cannot write to standard output");
}

}  // namespace

void add_tokenize_commands(CLI::App& root, CommandTable& table) {
  auto tok_opts = std::make_shared<TokenizeOptions>();
  CLI::App* tokenize = root.add_subcommand(
      "tokenize", "Print the token ids of a text file's whole content (no special tokens added unless asked)");
  tokenize->add_option("--tokenizer", tok_opts->tokenizer, "tokenizer.json, or a model folder with one")
      ->required();
  tokenize->add_option("--text-file", tok_opts->text_file, "UTF-8 text file ('-': standard input)")
      ->required();
  tokenize->add_flag("--special-tokens", tok_opts->special_tokens,
                     "add the special tokens of the tokenizer's post-processor (e.g. a BOS), as generate --prompt does");
  table.add(tokenize, [tok_opts] {
    Tokenizer tokenizer = Tokenizer::load(tok_opts->tokenizer);
    std::vector<int32_t> ids = tokenizer.encode(read_text_file(tok_opts->text_file));
    if (tok_opts->special_tokens) ids = tokenizer.with_special_tokens(ids);
    std::string line = fmt::format("{}\n", fmt::join(ids, " "));
    write_stdout(line);
    return 0;
  });

  auto detok_opts = std::make_shared<DetokenizeOptions>();
  CLI::App* detokenize =
      root.add_subcommand("detokenize", "Write the text of token ids (raw bytes, nothing added)");
  detokenize->add_option("--tokenizer", detok_opts->tokenizer, "tokenizer.json, or a model folder with one")
      ->required();
  detokenize->add_option("--ids", detok_opts->ids, "token ids (separate, or split by commas or spaces)")
      ->required();
  table.add(detokenize, [detok_opts] {
    Tokenizer tokenizer = Tokenizer::load(detok_opts->tokenizer);
    write_stdout(tokenizer.decode(parse_ids(detok_opts->ids)));
    return 0;
  });
}

}  // namespace lockstep::cli
