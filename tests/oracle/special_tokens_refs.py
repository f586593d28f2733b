#!/usr/bin/env python3
"""Which special tokens Hugging Face puts around a prompt, for variants of a
model folder's tokenizer_config.json (add_bos_token, add_eos_token,
tokenizer_class) and of tokenizer.json's post_processor.

For each real tokenizer (scripts/fetch_tokenizers.sh) and each variant, the
script writes the folder, loads it with transformers' AutoTokenizer and
records tokenizer(text)["input_ids"] (add_special_tokens=True, what vLLM and
transformers' generate feed the model for a plain prompt), and beside it
tokenizers' Tokenizer.from_file(...).encode(text).ids (tokenizer.json alone).

Writes a JSON list of
  {"tokenizer", "config": {overrides, null = key removed},
   "post_processor": "as_is" | "none" | "bos_template",
   "text", "transformers": [ids] or "error: ...", "tokenizers": [ids]}
to --out (tests/data/tokenizer/refs/special_tokens.json when committed).
Needs transformers and tokenizers; runs in about 40 s on 16 cores. It also
reports whether transformers' class for each folder as it is splits the
corpus as tokenizer.json alone does.

Found with transformers 5.17.0 and tokenizers 0.23.2 (2026-12-06): all 352
rows hold tokenizer.json's ids; the flags and the class change nothing, and
every class split all 19 corpus files as tokenizer.json does.

  python3 tests/oracle/special_tokens_refs.py --tokenizers build/tokenizers --out refs.json
"""
import argparse
import concurrent.futures
import copy
import json
import os
import tempfile

TOKENIZERS = ["llama2", "llama3", "qwen3", "gpt2"]
TEXTS = ["Hello world", ""]
# tokenizer_config.json overrides; None removes the key.
CONFIGS = [
    {},
    {"add_bos_token": None, "add_eos_token": None},
    {"add_bos_token": True},
    {"add_bos_token": False},
    {"add_eos_token": True},
    {"add_bos_token": True, "add_eos_token": True},
    {"add_bos_token": None, "add_eos_token": False},
    {"add_bos_token": None, "add_eos_token": True},
]
CLASSES = [None, "PreTrainedTokenizerFast"]  # None: the folder's own tokenizer_class
POST_PROCESSORS = ["as_is", "none", "bos_template"]


def bos_of(config):
    bos = config.get("bos_token")
    if isinstance(bos, dict):
        bos = bos.get("content")
    return bos


def bos_template(tokenizer_json, bos):
    bos_id = next((t["id"] for t in tokenizer_json.get("added_tokens", []) if t["content"] == bos), None)
    if bos_id is None:
        vocab = tokenizer_json["model"]["vocab"]
        bos_id = vocab.get(bos) if isinstance(vocab, dict) else None
    if bos_id is None:
        return None
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}


def run_case(args):
    source, name, overrides, cls, post = args
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer
    with open(os.path.join(source, name, "tokenizer.json")) as f:
        tok_json = json.load(f)
    with open(os.path.join(source, name, "tokenizer_config.json")) as f:
        config = json.load(f)
    config = copy.deepcopy(config)
    for key, value in overrides.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    if cls is not None:
        config["tokenizer_class"] = cls
    if post == "none":
        tok_json["post_processor"] = None
    elif post == "bos_template":
        bos = bos_of(config)
        template = bos_template(tok_json, bos) if bos else None
        if template is None:
            return []
        tok_json["post_processor"] = template
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "tokenizer.json"), "w") as f:
            json.dump(tok_json, f)
        with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
            json.dump(config, f)
        try:
            hf = AutoTokenizer.from_pretrained(folder)
            error = None
        except Exception as e:  # recorded, not fatal: the variant may be invalid
            hf, error = None, f"error: {type(e).__name__}: {str(e)[:200]}"
        raw = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        for text in TEXTS:
            rows.append({"tokenizer": name, "config": overrides, "tokenizer_class": cls or config.get("tokenizer_class"),
                         "post_processor": post, "text": text,
                         "transformers": error if hf is None else hf(text)["input_ids"],
                         "transformers_class": None if hf is None else type(hf).__name__,
                         "tokenizers": raw.encode(text).ids})
    return rows


def pipeline_check(source, corpus):
    """Whether transformers' class for each folder as it is splits text as
    tokenizer.json alone does (transformers 5 rebuilds some classes' pipeline)."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer
    report = {}
    files = sorted(f for f in os.listdir(corpus) if f.endswith(".txt"))
    for name in TOKENIZERS:
        hf = AutoTokenizer.from_pretrained(os.path.join(source, name))
        raw = Tokenizer.from_file(os.path.join(source, name, "tokenizer.json"))
        differ = []
        for file in files:
            with open(os.path.join(corpus, file), encoding="utf-8") as f:
                text = f.read()
            if hf(text, add_special_tokens=False)["input_ids"] != raw.encode(text, add_special_tokens=False).ids:
                differ.append(file)
        report[name] = {"class": type(hf).__name__, "files": len(files), "differ": differ}
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizers", default="build/tokenizers")
    parser.add_argument("--out", required=True)
    parser.add_argument("--corpus", default="tests/data/tokenizer/corpus")
    args = parser.parse_args()
    source = os.path.abspath(args.tokenizers)
    cases = [(source, n, c, k, p) for n in TOKENIZERS for c in CONFIGS for k in CLASSES for p in POST_PROCESSORS]
    with concurrent.futures.ProcessPoolExecutor() as pool:
        rows = [row for result in pool.map(run_case, cases) for row in result]
    import tokenizers
    import transformers
    pipeline = pipeline_check(source, os.path.abspath(args.corpus))
    print(json.dumps(pipeline))
    with open(args.out, "w") as f:
        json.dump({"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                   "pipeline": pipeline, "rows": rows}, f, indent=0)
    differ = sum(r["transformers"] != r["tokenizers"] for r in rows)
    print(f"{len(rows)} rows; transformers and tokenizer.json alone differ on {differ}")


if __name__ == "__main__":
    main()
