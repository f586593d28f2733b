#!/usr/bin/env python3
"""The strongest PyTorch-only decode we can run offline, as a peer for `lockstep bench`.

1. A static-KV-cache decode step (gpt-fast style, written here) under
   torch.compile(mode="reduce-overhead"): fused QKV and gate/up projections,
   SDPA over the whole static cache with a position mask (GQA native), greedy
   argmax inside the compiled step, one CUDA graph per batch size.
2. transformers' eager LlamaForCausalLM.generate (batch 1).

Both on the same random-weight Llama shape as the lockstep run (default: the
llama3-8b shape, bf16). With --lockstep-json (the JSON of `lockstep bench`),
prints lockstep's tok/s over each peer's.
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SHAPES = {
    "llama3-8b": dict(hidden=4096, inter=14336, layers=32, heads=32, kv_heads=8, head_dim=128, vocab=128256,
                      theta=500000.0, eps=1e-5),
    "llama3.2-1b": dict(hidden=2048, inter=8192, layers=16, heads=32, kv_heads=8, head_dim=64, vocab=128256,
                        theta=500000.0, eps=1e-5),
    "small": dict(hidden=768, inter=2048, layers=12, heads=12, kv_heads=4, head_dim=64, vocab=16384,
                  theta=10000.0, eps=1e-5),
}


def rms_norm(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rotate(x, cos, sin):  # x [B, 1, H, D]; rotate_half layout
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class Layer(nn.Module):
    def __init__(self, s, batch, max_seq, dtype):
        super().__init__()
        h, hd = s["hidden"], s["head_dim"]
        self.s = s
        new = lambda *shape: nn.Parameter(torch.randn(*shape, dtype=dtype, device="cuda") * 0.02, requires_grad=False)
        self.wqkv = new((s["heads"] + 2 * s["kv_heads"]) * hd, h)
        self.wo = new(h, s["heads"] * hd)
        self.w13 = new(2 * s["inter"], h)
        self.w2 = new(h, s["inter"])
        self.n1 = nn.Parameter(torch.ones(h, dtype=dtype, device="cuda"), requires_grad=False)
        self.n2 = nn.Parameter(torch.ones(h, dtype=dtype, device="cuda"), requires_grad=False)
        cache = (batch, s["kv_heads"], max_seq, hd)
        self.register_buffer("k_cache", torch.randn(cache, dtype=dtype, device="cuda"))
        self.register_buffer("v_cache", torch.randn(cache, dtype=dtype, device="cuda"))

    def forward(self, x, cos, sin, mask, pos):
        s, hd = self.s, self.s["head_dim"]
        B = x.shape[0]
        qkv = F.linear(rms_norm(x, self.n1, s["eps"]), self.wqkv)
        q, k, v = qkv.split([s["heads"] * hd, s["kv_heads"] * hd, s["kv_heads"] * hd], dim=-1)
        q = rotate(q.view(B, 1, s["heads"], hd), cos, sin).transpose(1, 2)
        k = rotate(k.view(B, 1, s["kv_heads"], hd), cos, sin).transpose(1, 2)
        v = v.view(B, 1, s["kv_heads"], hd).transpose(1, 2)
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        y = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask, enable_gqa=True)
        x = x + F.linear(y.transpose(1, 2).reshape(B, 1, s["heads"] * hd), self.wo)
        g, u = F.linear(rms_norm(x, self.n2, s["eps"]), self.w13).chunk(2, dim=-1)
        return x + F.linear(F.silu(g) * u, self.w2)


class Model(nn.Module):
    def __init__(self, s, batch, max_seq, dtype):
        super().__init__()
        self.s = s
        self.embed = nn.Parameter(torch.randn(s["vocab"], s["hidden"], dtype=dtype, device="cuda") * 0.02,
                                  requires_grad=False)
        self.out = nn.Parameter(torch.randn(s["vocab"], s["hidden"], dtype=dtype, device="cuda") * 0.02,
                                requires_grad=False)
        self.norm = nn.Parameter(torch.ones(s["hidden"], dtype=dtype, device="cuda"), requires_grad=False)
        self.layers = nn.ModuleList(Layer(s, batch, max_seq, dtype) for _ in range(s["layers"]))
        inv = 1.0 / (s["theta"] ** (torch.arange(0, s["head_dim"], 2, device="cuda").float() / s["head_dim"]))
        ang = torch.arange(max_seq, device="cuda").float()[:, None] * inv[None]
        self.register_buffer("cos", ang.cos())
        self.register_buffer("sin", ang.sin())
        self.register_buffer("positions", torch.arange(max_seq, device="cuda"))

    def forward(self, tokens, pos):  # tokens [B, 1], pos [1]: the step's position
        x = F.embedding(tokens, self.embed)
        cos, sin = self.cos[pos][:, None, :], self.sin[pos][:, None, :]
        mask = (self.positions <= pos).view(1, 1, 1, -1)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, pos)
        logits = F.linear(rms_norm(x, self.norm, self.s["eps"]), self.out)
        return logits.argmax(-1)  # greedy on the GPU: [B, 1]


def bench_compiled(s, batch, ctx, steps):
    torch._dynamo.reset()
    model = Model(s, batch, ctx + steps + 8, torch.bfloat16)
    step = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    tokens = torch.randint(1, s["vocab"], (batch, 1), device="cuda")
    pos = torch.tensor([ctx], device="cuda")
    t0 = time.perf_counter()
    with torch.inference_mode():
        for i in range(3):  # compile, record the graph, warm up
            tokens = step(tokens, pos + i).clone()
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(steps):
            tokens = step(tokens, pos + 3 + i).clone()
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    del model, step
    torch.cuda.empty_cache()
    return dict(batch=batch, tok_per_s=batch * steps / secs, ms_per_step=secs * 1e3 / steps, compile_s=compile_s)


def bench_transformers(s, ctx, new_tokens):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=s["hidden"], intermediate_size=s["inter"], num_hidden_layers=s["layers"],
                      num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"], head_dim=s["head_dim"],
                      vocab_size=s["vocab"], rope_theta=s["theta"], rms_norm_eps=s["eps"],
                      max_position_embeddings=ctx + new_tokens + 8)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    ids = torch.randint(1, s["vocab"], (1, ctx), device="cuda")
    times = {}
    with torch.inference_mode():
        for n in (1, 1, new_tokens):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
            torch.cuda.synchronize()
            times[n] = time.perf_counter() - t0
    del model
    torch.cuda.empty_cache()
    return dict(batch=1, tok_per_s=(new_tokens - 1) / (times[new_tokens] - times[1]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    ap.add_argument("--batch", default="1,32")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--hf-tokens", type=int, default=16)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--lockstep-json")
    ap.add_argument("--json")
    a = ap.parse_args()
    s = SHAPES[a.shape]
    torch.backends.cuda.matmul.allow_tf32 = False
    report = {"shape": a.shape, "ctx": a.ctx, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
              "compiled": [bench_compiled(s, int(b), a.ctx, a.steps) for b in a.batch.split(",")]}
    if not a.skip_hf:
        report["transformers_eager"] = bench_transformers(s, a.ctx, a.hf_tokens)
    lockstep = {}
    if a.lockstep_json:
        lockstep = {d["batch"]: d["tok_per_s"] for d in json.load(open(a.lockstep_json))["decode"]}
    print("peer                      batch  tok/s      ms/step  lockstep/peer")
    rows = [("torch.compile static", r) for r in report["compiled"]]
    if "transformers_eager" in report:
        rows.append(("transformers eager", report["transformers_eager"]))
    for name, r in rows:
        ratio = lockstep.get(r["batch"], math.nan) / r["tok_per_s"]
        ms = r.get("ms_per_step", 1e3 / r["tok_per_s"])
        print(f"{name:<25} {r['batch']:<6} {r['tok_per_s']:<10.1f} {ms:<8.3f} {ratio:.2f}")
    if a.json:
        json.dump(report, open(a.json, "w"), indent=2)


if __name__ == "__main__":
    main()
