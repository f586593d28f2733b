#!/usr/bin/env python3
"""Reference decodes of SentencePiece-style ids by Hugging Face tokenizers,
for the first-token rules of the two decoder spellings: the Metaspace decoder
(prepend_scheme "first" / "always": every "▁" of the first token dropped;
"never": none) and Llama 2's Replace + ByteFallback + Fuse + Strip (one
leading space of the whole text dropped).

The tokenizer is build/tokenizers/llama2's tokenizer.json (LLAMA2), as it is
("strip") and rewritten with no normalizer, a Metaspace pre-tokenizer and the
decoder Sequence[Metaspace, ByteFallback, Fuse] for each scheme, plus one
non-special added token holding "▁" (id 32000, "x▁y") in every variant. The
id sequences are seeded draws of 1-6 ids from tokens made of "▁" runs, words
with and without a "▁", byte tokens, the added token and <s> / </s>.

Writes a JSON object {"variants": {name: [[ids], text], ...}} with
decode(ids, skip_special_tokens=True); tests/test_tokenizer.cpp makes the
same rewrites. Needs tokenizers.

  python3 tests/oracle/metaspace_decode_refs.py --llama2 build/tokenizers/llama2/tokenizer.json \\
      --out tests/data/tokenizer/refs/metaspace_decode.json
"""
import argparse
import json
import random

from tokenizers import Tokenizer

ADDED = {"id": 32000, "content": "x\u2581y", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": False}
POOL = ["\u2581", "\u2581\u2581", "\u2581\u2581\u2581\u2581", "\u2581\u2581\u2581\u2581\u2581\u2581\u2581\u2581",
        "\u2581Hello", "Hello", "\u2581the", "ing", "<0x20>", "<0x0A>", "<0x41>", "<s>", "</s>", "x\u2581y"]


def variant(base, scheme):
    j = json.loads(json.dumps(base))
    j["added_tokens"].append(ADDED)
    if scheme is None:
        return j
    metaspace = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": scheme, "split": False}
    j["normalizer"] = None
    j["pre_tokenizer"] = metaspace
    j["decoder"] = {"type": "Sequence", "decoders": [metaspace, {"type": "ByteFallback"}, {"type": "Fuse"}]}
    return j


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama2", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(args.llama2) as f:
        base = json.load(f)
    out = {}
    for name, scheme in [("strip", None), ("first", "first"), ("always", "always"), ("never", "never")]:
        tok = Tokenizer.from_str(json.dumps(variant(base, scheme)))
        pool = [tok.token_to_id(t) for t in POOL]
        assert None not in pool, name
        rng = random.Random(20261206)
        rows = [[[i], tok.decode([i], skip_special_tokens=True)] for i in pool]
        for _ in range(400):
            ids = [rng.choice(pool) for _ in range(rng.randint(1, 6))]
            rows.append([ids, tok.decode(ids, skip_special_tokens=True)])
        out[name] = rows
    with open(args.out, "w") as f:
        json.dump({"variants": out}, f, ensure_ascii=False, indent=0)
    print({k: len(v) for k, v in out.items()})


if __name__ == "__main__":
    main()
