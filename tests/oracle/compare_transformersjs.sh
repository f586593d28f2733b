#!/usr/bin/env bash
# Second oracle: encodes every corpus file with transformers.js
# (@lenml/tokenizers) and lists the files whose ids differ from the Hugging
# Face reference ids in tests/data/tokenizer/refs.
#   npm install --prefix /tmp/tjs @lenml/tokenizers
#   NODE_PATH=/tmp/tjs/node_modules tests/oracle/compare_transformersjs.sh TOKENIZER_DIR
# TOKENIZER_DIR holds <name>/tokenizer.json for qwen3 and llama3 (as
# scripts/fetch_tokenizers.sh writes it); the committed fixtures are compared too.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tokdir=$1
data=$root/tests/data/tokenizer
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
declare -A files=([qwen3]=$tokdir/qwen3/tokenizer.json [llama3]=$tokdir/llama3/tokenizer.json
  [gen300]=$data/fixtures/gen300.json [gen4096]=$data/fixtures/gen4096.json
  [gen300_flags]=$data/fixtures/gen300_flags.json)
for name in qwen3 llama3 gen300 gen4096 gen300_flags; do
  for ref in "$data/refs/$name"/*.ids; do
    base=$(basename "$ref" .ids)
    node "$root/benchmarks/tokenizer_bench_transformersjs.cjs" "${files[$name]}" \
      "$data/corpus/$base.txt" --ids > "$out/ids"
    if cmp -s "$out/ids" "$ref"; then echo "same    $name $base"; else echo "DIFFERS $name $base"; fi
  done
done
