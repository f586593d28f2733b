#!/usr/bin/env bash
# --prompts-file throughput (continuous batching) for one or more lockstep
# binaries on the same model, alternating, as the twenty-first session's call 2
# ran it (benchmarks/RESULTS.md): 64 requests of 128 random prompt ids with
# max_new_tokens uniform in 16..512 (seed 21), --max-batch 16, --ignore-eos;
# with SHARED=1, 64 requests of one 1024-token prefix plus 64 own ids, 64 new
# tokens each. Prints generation time (wall less load) and tokens a second.
#   benchmarks/prompts_file_bench.sh MODEL_DIR [ROUNDS] BINARY [BINARY ...] [-- EXTRA GENERATE ARGS]
set -uo pipefail
MODEL=$1; shift
ROUNDS=2
if [[ ${1:-} =~ ^[0-9]+$ ]]; then ROUNDS=$1; shift; fi
BINS=(); while [ $# -gt 0 ] && [ "$1" != "--" ]; do BINS+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
WORK=$(mktemp -d)
python3 - "${SHARED:-0}" > "$WORK/p.jsonl" <<'PY'
import json, random, sys
if sys.argv[1] == "1":
    r = random.Random(5)
    prefix = [r.randrange(128000) for _ in range(1024)]
    for i in range(64):
        print(json.dumps({"prompt_ids": prefix + [r.randrange(128000) for _ in range(64)], "max_new_tokens": 64}))
else:
    r = random.Random(21)
    for i in range(64):
        print(json.dumps({"prompt_ids": [r.randrange(128000) for _ in range(128)], "max_new_tokens": r.randint(16, 512)}))
PY
printf "%-40s %-6s %8s %10s %s\n" binary round gen_s tok_per_s "prompt tokens found in a cache"
for round in $(seq "$ROUNDS"); do
  for bin in "${BINS[@]}"; do
    start=$(date +%s.%N)
    "$bin" generate --model "$MODEL" --prompts-file "$WORK/p.jsonl" --max-batch 16 --ignore-eos --max-seq-len 2048 "$@" \
      > "$WORK/out" 2> "$WORK/err"
    rc=$?; end=$(date +%s.%N)
    python3 - "$WORK/out" "$WORK/err" "$start" "$end" "$rc" "$bin" "$round" <<'PY'
import json, re, sys
out, err, start, end, rc, binary, rnd = sys.argv[1:]
tokens = sum(len(json.loads(l)["ids"]) for l in open(out))
log = open(err).read()
load = re.search(r"loaded in ([0-9.]+) s", log)
gen = float(end) - float(start) - (float(load.group(1)) if load else 0.0)
found = re.search(r"requests: (.*) \(", log)
print(f"{binary[-40:]:<40} {rnd:<6} {gen:8.2f} {tokens / gen:10.1f} {found.group(1) if found else ''}" + ("" if rc == "0" else f" rc={rc}"))
PY
  done
done
rm -rf "$WORK"
