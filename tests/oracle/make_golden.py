#!/usr/bin/env python3
"""Writes the golden fixtures under tests/data/golden/: small random-weight
models saved by transformers in the Hugging Face layout, and the logits that
transformers computes for them in float64.

Runs where torch and transformers are installed (the GPU machine; the CPU is
enough). For each case:
  <case>/model/            config.json, generation_config.json, safetensors
  <case>/case.json         prompt ids, greedy ids, tolerance notes
  <case>/score.npy         float32 [prompt, vocab]: teacher-forced logits
  <case>/generate.npy      float32 [new, vocab]: logits that chose each greedy id
The checkpoint is stored in the case's dtype; the oracle loads that checkpoint
back in float64, so ours and theirs start from identical weights.
"""
import argparse
import json
import os
import shutil

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

CASES = [
    # name, arch, dtype, config-style, extra config, sharded
    dict(name="llama_gqa_bf16", arch="llama", dtype=torch.bfloat16, style="transformers5",
         cfg=dict(num_attention_heads=4, num_key_value_heads=2)),
    dict(name="llama3_rope_tied_f16", arch="llama", dtype=torch.float16, style="classic",
         cfg=dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True,
                  rope=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                            original_max_position_embeddings=16), rope_theta=500000.0)),
    dict(name="mistral_mqa_f32", arch="mistral", dtype=torch.float32, style="classic",
         cfg=dict(num_attention_heads=4, num_key_value_heads=1, sliding_window=None)),
    dict(name="qwen2_bias_bf16_sharded", arch="qwen2", dtype=torch.bfloat16, style="transformers5",
         cfg=dict(num_attention_heads=4, num_key_value_heads=2), shard=True),
    dict(name="qwen3_qknorm_bf16", arch="qwen3", dtype=torch.bfloat16, style="transformers5",
         cfg=dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32)),
    dict(name="llama_attn_bias_f32", arch="llama", dtype=torch.float32, style="classic",
         cfg=dict(num_attention_heads=8, num_key_value_heads=4, attention_bias=True, rms_norm_eps=1e-3)),
    # Linear RoPE scaling (positions divided by the factor), classic keys.
    dict(name="llama_linear_rope_bf16", arch="llama", dtype=torch.bfloat16, style="classic",
         cfg=dict(num_attention_heads=4, num_key_value_heads=2, rope=dict(rope_type="linear", factor=4.0))),
    # YaRN: a ramp between interpolated and original frequencies, and the
    # attention factor on cos/sin. The ratio max_position_embeddings /
    # original_max_position_embeddings (8) differs from the factor (4), as in
    # Qwen3's published YaRN settings, so the fixture pins which one counts.
    dict(name="qwen3_yarn_f32", arch="qwen3", dtype=torch.float32, style="transformers5",
         cfg=dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  rope=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32))),
    # Dynamic NTK scaling: the default frequencies up to the original length.
    dict(name="llama_dynamic_rope_f16", arch="llama", dtype=torch.float16, style="classic",
         cfg=dict(num_attention_heads=4, num_key_value_heads=4, rope=dict(rope_type="dynamic", factor=2.0))),
    # A sliding window longer than the fixture's 17 positions: within the
    # window, sliding-window attention is full causal attention.
    dict(name="mistral_window_bf16", arch="mistral", dtype=torch.bfloat16, style="classic",
         cfg=dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=32)),
    # Windows shorter than the 17 positions: Mistral windows every layer;
    # Qwen2 with use_sliding_window the layers from max_window_layers on (the
    # second); Qwen3 the layers layer_types names (the first).
    dict(name="mistral_short_window_f32", arch="mistral", dtype=torch.float32, style="classic",
         cfg=dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=4)),
    dict(name="qwen2_window_layer1_bf16", arch="qwen2", dtype=torch.bfloat16, style="transformers5",
         cfg=dict(num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=5,
                  max_window_layers=1)),
    dict(name="qwen3_window_layer0_f32", arch="qwen3", dtype=torch.float32, style="transformers5",
         cfg=dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, use_sliding_window=True,
                  sliding_window=3, layer_types=["sliding_attention", "full_attention"])),
]

CONFIG_CLASSES = {
    "llama": transformers.LlamaConfig,
    "mistral": transformers.MistralConfig,
    "qwen2": transformers.Qwen2Config,
    "qwen3": transformers.Qwen3Config,
}


def make_config(case):
    extra = dict(case["cfg"])
    rope = extra.pop("rope", None)
    theta = extra.pop("rope_theta", 10000.0)
    base = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, vocab_size=384,
                max_position_embeddings=256, rms_norm_eps=1e-5, hidden_act="silu",
                tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, initializer_range=0.08)
    base.update(extra)
    params = dict(rope_type="default", rope_theta=theta)
    if rope:
        params.update(rope)
    try:
        return CONFIG_CLASSES[case["arch"]](rope_parameters=params, **base)
    except TypeError:
        scaling = None if params["rope_type"] == "default" else {k: v for k, v in params.items() if k != "rope_theta"}
        return CONFIG_CLASSES[case["arch"]](rope_theta=theta, rope_scaling=scaling, **base)


def randomize(model, gen):
    """transformers initializes norms to one and biases to zero: perturb them so
    that a wrong norm or a dropped bias shows in the logits."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def to_classic(config_path):
    """Rewrites a transformers-5 config.json in the classic key style."""
    with open(config_path) as f:
        c = json.load(f)
    params = c.pop("rope_parameters", None) or {}
    c["rope_theta"] = params.get("rope_theta", 10000.0)
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    c["rope_scaling"] = None if scaling.get("rope_type", "default") == "default" else scaling
    if "dtype" in c:
        c["torch_dtype"] = c.pop("dtype")
    with open(config_path, "w") as f:
        json.dump(c, f, indent=2)


def greedy(model, prompt, new_tokens):
    ids = list(prompt)
    rows = []
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1]
            rows.append(logits.numpy())
            ids.append(int(torch.argmax(logits)))
    return ids[len(prompt):], np.stack(rows)


def margin_ok(rows, std):
    top2 = np.sort(rows, axis=1)[:, -2:]
    return float(np.min(top2[:, 1] - top2[:, 0])) > 0.05 * std


def check_window_acts(case, model_dir, prompt, score):
    """A window shorter than the prompt must change the oracle's logits past
    it, and only there: the same checkpoint without the window agrees on the
    first `window` positions and differs after them."""
    window = case["cfg"].get("sliding_window") or 0
    if not window or window >= len(prompt):
        return
    layers = case["cfg"].get("num_hidden_layers", 2)
    override = (dict(sliding_window=None) if case["arch"] == "mistral"
                else dict(layer_types=["full_attention"] * layers))
    full = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64, attn_implementation="eager",
                                                **override)
    with torch.no_grad():
        other = full(torch.tensor([prompt])).logits[0].numpy()
    if not np.allclose(other[:window], score[:window], rtol=0, atol=1e-9):
        raise SystemExit(f"{case['name']}: positions inside the window differ without it")
    if np.allclose(other[window:], score[window:], rtol=0, atol=1e-6):
        raise SystemExit(f"{case['name']}: the oracle ignored the sliding window")


def make_case(case, out_dir, prompt_len, new_tokens):
    torch.manual_seed(1234)
    gen = torch.Generator().manual_seed(4321)
    config = make_config(case)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize(model, gen)
    model = model.to(case["dtype"])
    model_dir = os.path.join(out_dir, case["name"], "model")
    shutil.rmtree(os.path.join(out_dir, case["name"]), ignore_errors=True)
    model.save_pretrained(model_dir, max_shard_size="100KB" if case.get("shard") else "1GB")
    if case["style"] == "classic":
        to_classic(os.path.join(model_dir, "config.json"))
    oracle = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64, attn_implementation="eager")
    oracle.eval()
    rng = np.random.default_rng(99)
    for attempt in range(50):
        prompt = [int(x) for x in rng.integers(0, config.vocab_size, prompt_len)]
        with torch.no_grad():
            score = oracle(torch.tensor([prompt])).logits[0].numpy()
        ids, rows = greedy(oracle, prompt, new_tokens)
        std = float(np.std(score))
        if margin_ok(rows, std):
            break
    else:
        raise SystemExit(f"{case['name']}: no prompt with a clear greedy margin")
    check_window_acts(case, model_dir, prompt, score)
    np.save(os.path.join(out_dir, case["name"], "score.npy"), score.astype(np.float32))
    np.save(os.path.join(out_dir, case["name"], "generate.npy"), rows.astype(np.float32))
    meta = dict(prompt=prompt, greedy=ids, max_new_tokens=new_tokens, score_std=std,
                generate_std=float(np.std(rows)), arch=case["arch"], dtype=str(case["dtype"]),
                config_style=case["style"], transformers=transformers.__version__, torch=torch.__version__)
    with open(os.path.join(out_dir, case["name"], "case.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"{case['name']}: prompt {len(prompt)} greedy {ids} std {std:.4f} (attempt {attempt})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompt-len", type=int, default=11)
    ap.add_argument("--new-tokens", type=int, default=6)
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    a = ap.parse_args()
    torch.set_num_threads(4)
    only = set(filter(None, a.only.split(",")))
    unknown = only - {c["name"] for c in CASES}
    if unknown:
        raise SystemExit(f"unknown cases: {sorted(unknown)}")
    for case in CASES:
        if not only or case["name"] in only:
            make_case(case, a.out, a.prompt_len, a.new_tokens)


if __name__ == "__main__":
    main()
