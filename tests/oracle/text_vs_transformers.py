#!/usr/bin/env python3
"""The text lockstep prints against transformers' decode of the same ids.

Random-weight models sample random tokens, so their replies are full of byte
tokens that do not form UTF-8, special tokens in the middle and leading
spaces: the places where a detokenizer can drift from Hugging Face's. For a
tiny model with make-model's byte-level BPE tokenizer, and the same model with
a SentencePiece-style tokenizer (LLAMA2_DIR: tokenizer.json and
tokenizer_config.json, e.g. build/tokenizers/llama2), it runs
`lockstep generate --prompts-file` (CPU backend, sampled, eos ignored) and
compares each line's "text" with
AutoTokenizer.from_pretrained(model).decode(ids, skip_special_tokens=True).

  python3 tests/oracle/text_vs_transformers.py --lockstep build/lockstep \\
      --out /tmp/text_check [--llama2 build/tokenizers/llama2] [--lines 64]

Byte fallback: Hugging Face replaces every byte of a run of byte tokens that
is not valid UTF-8, lockstep only the invalid bytes (see common/utf8.h); such
lines are counted apart. Exit status 1 on any other difference.
"""
import argparse
import json
import os
import shutil
import subprocess

from transformers import AutoTokenizer


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr[-2000:]}")
    return r.stdout


def generate(lockstep, model, out, lines, vocab):
    prompts = os.path.join(out, "prompts.jsonl")
    with open(prompts, "w") as f:
        for i in range(lines):
            f.write(json.dumps({"prompt": f"line {i}: caf\u00e9 \u4e2d\u6587 \U0001F600 ok",
                                "temperature": 1.0, "seed": i, "max_new_tokens": 48}) + "\n")
    text = run([lockstep, "generate", "--backend", "cpu", "--model", model, "--prompts-file", prompts,
                "--ignore-eos", "--log-level", "warn"])
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def byte_run_differs(tok, ids):
    """True when the ids hold a run of byte tokens that is invalid UTF-8 yet
    holds a valid character (where the two rules part)."""
    run = bytearray()
    for t in tok.convert_ids_to_tokens(ids) + [""]:
        if len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            run.append(int(t[3:5], 16))
            continue
        if run:
            lossy = bytes(run).decode("utf-8", errors="replace")
            if "\ufffd" in lossy and lossy.replace("\ufffd", ""):
                return True
            run = bytearray()
    return False


def check(name, lockstep, model, out, lines):
    tok = AutoTokenizer.from_pretrained(model)
    results = generate(lockstep, model, out, lines, len(tok))
    same = apart = fffd = 0
    bad = []
    for r in results:
        want = tok.decode(r["ids"], skip_special_tokens=True)
        fffd += "\ufffd" in want
        if r["text"] == want:
            same += 1
        elif byte_run_differs(tok, r["ids"]):
            apart += 1
        else:
            bad.append((r["index"], r["text"], want))
    print(f"{name}: {len(results)} lines, {same} equal, {apart} set apart (byte-fallback runs), "
          f"{len(bad)} differ; {fffd} hold U+FFFD")
    for index, got, want in bad[:5]:
        print(f"  line {index}: lockstep {got!r}\n           transformers {want!r}")
    return len(bad)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lockstep", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--llama2", default="")
    ap.add_argument("--lines", type=int, default=64)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    bad = 0
    byte_level = os.path.join(args.out, "byte_level")
    run([args.lockstep, "make-model", "--arch", "llama", "--preset", "tiny", "--out", byte_level])
    bad += check("byte-level BPE", args.lockstep, byte_level, args.out, args.lines)
    if args.llama2 and os.path.exists(os.path.join(args.llama2, "tokenizer.json")):
        sp = os.path.join(args.out, "sentencepiece")
        run([args.lockstep, "make-model", "--arch", "llama", "--preset", "tiny", "--vocab-size", "32000",
             "--out", sp])
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(args.llama2, f), os.path.join(sp, f))
        bad += check("SentencePiece byte fallback", args.lockstep, sp, args.out, args.lines)
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
