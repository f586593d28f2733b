#!/usr/bin/env python3
"""Reference repairs of invalid UTF-8 by Python's decoder (errors="replace"),
which puts one U+FFFD per maximal subpart as Unicode recommends, as Rust's
String::from_utf8_lossy does and so Hugging Face's ByteLevel decoder.

Writes tests/data/tokenizer/refs/utf8_repair.json: a list of
[bytes as hex, repaired text as UTF-8 hex]. The cases: every lead byte
followed by each interesting second byte, then seeded random strings of
1-9 bytes drawn from the bytes where the rules change (ASCII, the lead bytes
at the edges of Table 3-7's rows, continuation bytes at the edges of their
ranges). Deterministic.

  python3 tests/oracle/utf8_repair_refs.py
"""
import json
import os
import random

EDGES = [0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0,
         0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xF8, 0xFE, 0xFF]
CONTINUATIONS = [0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF]


def cases():
    out = [bytes([b]) for b in range(256)]
    for lead in range(0x80, 0x100):
        for second in EDGES:
            out.append(bytes([lead, second]))
    rng = random.Random(20261206)
    alphabet = EDGES + CONTINUATIONS * 3
    for _ in range(1500):
        out.append(bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 9))))
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "data", "tokenizer", "refs", "utf8_repair.json")
    rows = [[c.hex(), c.decode("utf-8", errors="replace").encode("utf-8").hex()] for c in cases()]
    with open(path, "w") as f:
        json.dump(rows, f, separators=(",", ":"))
        f.write("\n")
    print(f"{path}: {len(rows)} cases")


if __name__ == "__main__":
    main()
