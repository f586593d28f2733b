// Placeholder until the tokenizer lands: registers nothing.
#include "launch/commands.h"

namespace lockstep::cli {
void add_tokenize_commands(CLI::App&, CommandTable&) {}
}  // namespace lockstep::cli
