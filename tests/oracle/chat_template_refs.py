#!/usr/bin/env python3
"""Reference renderings of chat templates by Python's jinja2, set up the way
transformers' apply_chat_template sets it up: an ImmutableSandboxedEnvironment
with trim_blocks, lstrip_blocks and loop controls, a tojson filter that is
json.dumps(ensure_ascii=False), raise_exception and strftime_now, a
`generation` tag that renders its body, and the variables messages,
add_generation_prompt, tools=None, documents=None, date_string (fixed, so that
Llama 3.1/3.2 templates do not write today's date) plus the special tokens.

For each template T and conversation C it writes OUT/T/C.VARIANT.txt: the
rendered text, or "ERROR: <message>" when the template raised.

  python3 tests/oracle/chat_template_refs.py --data tests/data/chat \
      [--real qwen3=build/tokenizers/qwen3/tokenizer_config.json ...]

Templates: DATA/templates/*.jinja (with FIXTURE_TOKENS) and each --real
tokenizer_config.json (its chat_template and special tokens).
"""
import argparse
import json
import os
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXTURE_TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}
DATE_STRING = "26 Jul 2024"

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]

VARIANTS = {
    "gen": (True, {}),
    "nogen": (False, {}),
    "nothink": (True, {"enable_thinking": False}),
    "withtools": (True, {"tools": TOOLS}),
}


class GenerationTag(Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def special_tokens(config):
    out = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        v = config.get(key)
        if isinstance(v, str):
            out[key] = v
        elif isinstance(v, dict) and isinstance(v.get("content"), str):
            out[key] = v["content"]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--real", action="append", default=[], help="NAME=tokenizer_config.json")
    args = ap.parse_args()

    templates = {}
    tdir = os.path.join(args.data, "templates")
    for f in sorted(os.listdir(tdir)):
        if f.endswith(".jinja"):
            with open(os.path.join(tdir, f), encoding="utf-8", newline="") as fh:
                templates[f[:-6]] = (fh.read(), FIXTURE_TOKENS)
    for spec in args.real:
        name, path = spec.split("=", 1)
        with open(path, encoding="utf-8") as fh:
            config = json.load(fh)
        templates[name] = (config["chat_template"], special_tokens(config))

    env = environment()
    cdir = os.path.join(args.data, "conversations")
    conversations = {f[:-5]: json.load(open(os.path.join(cdir, f), encoding="utf-8"))
                     for f in sorted(os.listdir(cdir)) if f.endswith(".json")}
    for tname, (source, tokens) in templates.items():
        compiled = env.from_string(source)
        out_dir = os.path.join(args.data, "refs", tname)
        os.makedirs(out_dir, exist_ok=True)
        for cname, messages in conversations.items():
            for vname, (gen, extra) in VARIANTS.items():
                # A fixed date_string: Llama 3.1/3.2 templates otherwise write today's date.
                variables = {"tools": None, "documents": None, "date_string": DATE_STRING, **tokens, **extra}
                try:
                    text = compiled.render(messages=messages, add_generation_prompt=gen, **variables)
                except jinja2.exceptions.TemplateError as e:
                    text = "ERROR: " + str(e)
                with open(os.path.join(out_dir, f"{cname}.{vname}.txt"), "w", encoding="utf-8", newline="") as fh:
                    fh.write(text)
        print(tname, "rendered", len(conversations) * len(VARIANTS), "cases")


if __name__ == "__main__":
    main()
