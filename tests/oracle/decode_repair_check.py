#!/usr/bin/env python3
"""Checks the rule lockstep's StreamDecoder follows for bytes that are not
valid UTF-8 against Hugging Face tokenizers' own decode (needs `tokenizers`;
run on the device machine):

- byte-level BPE (tests/data/tokenizer/fixtures/gen300.json, ids 0..255 the
  bytes): decode(ids) must equal Python's bytes.decode("utf-8", "replace") of
  the tokens' bytes, i.e. one U+FFFD per maximal subpart;
- SentencePiece-style byte fallback (LLAMA2, e.g. build/tokenizers/llama2/
  tokenizer.json): each run of byte tokens is replaced by one U+FFFD per byte
  when the run is not valid UTF-8. lockstep replaces only the bytes that
  start no valid character (the text streams); the cases where that differs
  (an invalid run that also holds a valid character) are counted apart.

  python3 tests/oracle/decode_repair_check.py [--llama2 PATH] [--cases N]
Prints the counts; exits 1 on any disagreement outside the counted class.
"""
import argparse
import json
import os
import random

from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
EDGES = [0x41, 0x0A, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC2, 0xDF, 0xE0, 0xE4, 0xED,
         0xEF, 0xF0, 0xF4, 0xF5, 0xFF, 0xB8, 0xAD]


def lockstep_each_byte(run):
    """lockstep's rule: one U+FFFD per byte that starts no valid character."""
    out, i = [], 0
    while i < len(run):
        for n in (1, 2, 3, 4):
            try:
                out.append(run[i:i + n].decode("utf-8"))
                i += n
                break
            except UnicodeDecodeError:
                continue
        else:
            out.append("\ufffd")
            i += 1
    return "".join(out)


def hf_byte_fallback(run):
    """Hugging Face's ByteFallback: a run that is not valid UTF-8 becomes one
    U+FFFD per byte, valid characters in it included."""
    try:
        return run.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" * len(run)


def check_byte_level(cases, rng):
    tok = Tokenizer.from_file(os.path.join(HERE, "..", "data", "tokenizer", "fixtures", "gen300.json"))
    bad = 0
    for _ in range(cases):
        ids = [rng.choice(EDGES) for _ in range(rng.randint(1, 8))]
        want = bytes(ids).decode("utf-8", errors="replace")
        got = tok.decode(ids)
        if got != want:
            bad += 1
            if bad <= 5:
                print("byte-level differs:", bytes(ids).hex(), repr(got), repr(want))
    print(f"byte-level: {cases} cases, {bad} differ from maximal subparts")
    return bad


def check_added_tokens():
    """Added tokens go through the ByteLevel decoder's alphabet too."""
    path = os.path.join(HERE, "..", "data", "tokenizer", "fixtures", "gen300.json")
    with open(path) as f:
        j = json.load(f)
    # Contents not in the vocab (tokenizers gives a vocab spelling its vocab
    # id, whatever the file says) and ids in order after it.
    for i, content in enumerate(["\u0120hi", "\u00e9\u00e9", "a b"]):
        j["added_tokens"].append({"id": 300 + i, "content": content, "single_word": False, "lstrip": False,
                                  "rstrip": False, "normalized": False, "special": False})
    tok = Tokenizer.from_str(json.dumps(j))
    got = [tok.decode([300]), tok.decode([301]), tok.decode([302])]
    want = [" hi", "\ufffd\ufffd", "a b"]
    print(f"added tokens: decoded {got!r}, lockstep's rule {want!r}")
    return int(got != want)


def check_byte_fallback(path, cases, rng):
    tok = Tokenizer.from_file(path)
    byte_id = {b: tok.token_to_id(f"<0x{b:02X}>") for b in range(256)}
    hello = tok.token_to_id("\u2581Hello")
    bad = mixed = 0
    for _ in range(cases):
        run = bytes(rng.choice(EDGES) for _ in range(rng.randint(1, 6)))
        ids = [hello] + [byte_id[b] for b in run] + [hello]
        want = "Hello" + hf_byte_fallback(run) + " Hello"
        ours = "Hello" + lockstep_each_byte(run) + " Hello"
        got = tok.decode(ids)
        if got != want:
            bad += 1
            if bad <= 5:
                print("byte fallback is not as described:", run.hex(), repr(got), repr(want))
        mixed += ours != got
    print(f"byte fallback: {cases} cases, {bad} differ from the rule described, "
          f"{mixed} where lockstep differs (an invalid run holding a valid character)")
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama2", default=os.path.join(HERE, "..", "..", "build", "tokenizers", "llama2", "tokenizer.json"))
    ap.add_argument("--cases", type=int, default=20000)
    args = ap.parse_args()
    rng = random.Random(7)
    bad = check_byte_level(args.cases, rng) + check_added_tokens()
    if os.path.exists(args.llama2):
        bad += check_byte_fallback(args.llama2, args.cases, rng)
    else:
        print(f"byte fallback: skipped ({args.llama2} is absent)")
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
