#!/usr/bin/env python3
"""Reference ids from Hugging Face tokenizers (the Rust library) for the corpus.

For each --tokenizer NAME=PATH and each corpus file F.txt, writes
OUT/NAME/F.ids: the space-separated ids of
Tokenizer.from_file(PATH).encode(text, add_special_tokens=False).ids,
where text is F's bytes decoded as UTF-8 (no newline translation).

Also writes OUT/report.json: tokenizers version, whether decode(encode(text))
gives back the (normalized) text, and with --bench FILE the single-threaded
encode throughput on FILE (median of --repeats runs).

  python3 tokenizer_refs.py --out refs --corpus corpus \
      --tokenizer qwen3=qwen3.json --tokenizer llama3=llama3.json \
      --bench corpus/long_document.txt
"""
import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


def read_text(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8")


def bench(tok, text, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        tok.encode(text, add_special_tokens=False)
        times.append(time.perf_counter() - t0)
    mb = len(text.encode("utf-8")) / 1e6
    return {"bytes": len(text.encode("utf-8")), "first_s": times[0],
            "median_s": statistics.median(times), "median_mb_per_s": mb / statistics.median(times),
            "best_mb_per_s": mb / min(times), "repeats": repeats}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--tokenizer", action="append", required=True, help="NAME=PATH")
    ap.add_argument("--bench")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()

    files = sorted(f for f in os.listdir(args.corpus) if f.endswith(".txt"))
    report = {"tokenizers_version": tokenizers.__version__, "python": sys.version,
              "tokenizers": {}}
    for spec in args.tokenizer:
        name, path = spec.split("=", 1)
        t0 = time.perf_counter()
        tok = Tokenizer.from_file(path)
        entry = {"load_s": time.perf_counter() - t0,
                 "vocab_size_with_added": tok.get_vocab_size(with_added_tokens=True),
                 "files": {}}
        os.makedirs(os.path.join(args.out, name), exist_ok=True)
        for fname in files:
            text = read_text(os.path.join(args.corpus, fname))
            ids = tok.encode(text, add_special_tokens=False).ids
            with open(os.path.join(args.out, name, fname[:-4] + ".ids"), "w") as f:
                f.write(" ".join(str(i) for i in ids) + "\n")
            decoded = tok.decode(ids, skip_special_tokens=False)
            normalized = text
            if tok.normalizer is not None:
                normalized = tok.normalizer.normalize_str(text)
            entry["files"][fname] = {"n_ids": len(ids), "roundtrip_text": decoded == text,
                                     "roundtrip_normalized": decoded == normalized}
        if args.bench:
            entry["bench"] = bench(tok, read_text(args.bench), args.repeats)
        report["tokenizers"][name] = entry
        print(name, json.dumps({k: v for k, v in entry.items() if k != "files"}), flush=True)
    with open(os.path.join(args.out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
