#!/usr/bin/env python3
"""lockstep against transformers on model shapes like the ones users run.

    tools/oracle_sweep.py --lockstep BUILD/lockstep --out DIR [--only a,b] [--jobs 4]

The golden fixtures (tests/data/golden) are tiny (head_dim 8-32, hidden 64),
so on a GPU they take the CUDA-core attention and never the tensor-core
tilings, the GEMV or cuBLASLt at real widths. This sweep builds random-weight
models in the shapes of published checkpoints (SmolLM2, Qwen2.5, Llama 3.2,
Qwen3, Mistral, head sizes 80/96/256, sliding windows), two layers each, with
transformers; computes the oracle logits in float64 on the CPU (eager
attention); and runs `lockstep score` (CUDA in the checkpoint's 16-bit type
and in float32, and the CPU backend) and greedy `lockstep generate` (CUDA,
float32 and 16-bit) on prompts of 45 and 300 tokens (several key tiles, two
prefill chunks of --max-step-tokens 256), for three cases also on 2000 tokens (eight prefill chunks;
greedy decode over 32 key tiles, the oracle decoding on its KV cache); and `score` of the 300 tokens at tensor-parallel sizes
--tp (mpirun, ranks sharing the one GPU through the host-staged transport:
the same sharded kernels as on several GPUs, KV heads replicated where the
size exceeds them) wherever the size divides the model. Needs torch,
transformers and mpirun: the GPU machine.

Tolerances (max |error| over all logits, as a fraction of the oracle's logit
standard deviation), the golden tests' reasoning at these widths:
  float32: 1e-3. Summation orders differ from float64 (cuBLASLt's split-k,
           the attention's online softmax); measured errors are ~1e-5.
  16-bit: 0.1. Activations are rounded to 8 (bf16) or 11 (f16) bits between
          ops, ~0.4% relative each; over two layers and the LM head that
          gives a few 1e-2 of the std.
Greedy decoding: the logits of each step up to the first id that differs,
within the same tolerances; float32 ids must equal the oracle's over 16
tokens where the oracle's top-2 margin is above 5% of the std at every step
(the short prompt is drawn until it is; at a near-tie ids are reported only).
Prints one line per run and a summary; exit status 1 if any run is outside
its tolerance or failed.
"""
import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "oracle"))
from make_golden import make_config, randomize, to_classic, greedy, margin_ok, check_window_acts  # noqa: E402

BASE = dict(num_hidden_layers=2, max_position_embeddings=4096, initializer_range=0.02)
CASES = [
    dict(name="smollm2_135m_shape", arch="llama", dtype=torch.bfloat16, style="transformers5",
         cfg=dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
                  vocab_size=2048, tie_word_embeddings=True, rope_theta=100000.0)),
    dict(name="qwen25_05b_shape", arch="qwen2", dtype=torch.bfloat16, style="transformers5",
         cfg=dict(hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2,
                  vocab_size=2048, tie_word_embeddings=True, rope_theta=1000000.0)),
    dict(name="llama32_1b_shape", arch="llama", dtype=torch.bfloat16, style="classic",
         cfg=dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8,
                  vocab_size=4096, tie_word_embeddings=True, rope_theta=500000.0,
                  rope=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                            original_max_position_embeddings=256))),
    dict(name="qwen3_06b_shape", arch="qwen3", dtype=torch.bfloat16, style="transformers5",
         cfg=dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8,
                  head_dim=128, vocab_size=4096, tie_word_embeddings=True, rope_theta=1000000.0)),
    dict(name="mistral_7b_shape_1layer", arch="mistral", dtype=torch.bfloat16, style="classic",
         cfg=dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                  num_hidden_layers=1, vocab_size=4096, sliding_window=4096)),
    dict(name="llama_f16_hd128", arch="llama", dtype=torch.float16, style="classic",
         cfg=dict(hidden_size=1536, intermediate_size=4096, num_attention_heads=12, num_key_value_heads=4,
                  vocab_size=3001)),
    dict(name="llama_f32_mha_hd64", arch="llama", dtype=torch.float32, style="classic",
         cfg=dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12, num_key_value_heads=12,
                  vocab_size=2048)),
    dict(name="llama_hd96_odd_inter", arch="llama", dtype=torch.bfloat16, style="transformers5",
         cfg=dict(hidden_size=768, intermediate_size=2000, num_attention_heads=8, num_key_value_heads=2,
                  head_dim=96, vocab_size=3001)),
    dict(name="llama_hd80", arch="llama", dtype=torch.bfloat16, style="transformers5",
         cfg=dict(hidden_size=640, intermediate_size=1720, num_attention_heads=8, num_key_value_heads=8,
                  vocab_size=2048)),
    dict(name="qwen3_hd256_mqa", arch="qwen3", dtype=torch.bfloat16, style="transformers5",
         cfg=dict(hidden_size=1024, intermediate_size=2816, num_attention_heads=4, num_key_value_heads=1,
                  head_dim=256, vocab_size=2048)),
    # Sliding windows shorter than the prompts: Mistral windows every layer;
    # Qwen2 only the layers from max_window_layers on (here the second).
    dict(name="mistral_window_200", arch="mistral", dtype=torch.bfloat16, style="classic",
         cfg=dict(hidden_size=1024, intermediate_size=3584, num_attention_heads=8, num_key_value_heads=2,
                  head_dim=128, vocab_size=2048, sliding_window=200)),
    dict(name="qwen2_window_layer2", arch="qwen2", dtype=torch.bfloat16, style="transformers5",
         cfg=dict(hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2,
                  vocab_size=2048, use_sliding_window=True, sliding_window=100, max_window_layers=1)),
]
PROMPT_LENS = (45, 300)
LONG_LEN = 2000  # cases with long=True: prefill in 8 chunks, decode over 32 key tiles
LONG_CASES = {"llama32_1b_shape", "qwen3_06b_shape", "llama_hd96_odd_inter", "mistral_window_200"}
NEW_TOKENS = 16
MAX_SEQ = "2560"


def build_case(case, root):
    """Writes the model and the oracle's logits; returns the case's metadata."""
    torch.manual_seed(1234)
    gen = torch.Generator().manual_seed(4321)
    cfg = {**BASE, **case["cfg"]}
    config = make_config(dict(case, cfg=cfg))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize(model, gen)
    model = model.to(case["dtype"])
    model_dir = os.path.join(root, case["name"], "model")
    model.save_pretrained(model_dir)
    if case["style"] == "classic":
        to_classic(os.path.join(model_dir, "config.json"))
    oracle = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64, attn_implementation="eager")
    oracle.eval()
    rng = np.random.default_rng(7)
    meta = dict(name=case["name"], dtype=str(case["dtype"]).replace("torch.", ""), prompts={})
    with torch.no_grad():
        for n in PROMPT_LENS:
            prompt = [int(x) for x in rng.integers(0, config.vocab_size, n)]
            score = oracle(torch.tensor([prompt])).logits[0].numpy()
            np.save(os.path.join(root, case["name"], f"oracle_{n}.npy"), score)
            meta["prompts"][n] = prompt
        check_window_acts(dict(case, cfg=cfg), model_dir, prompt, score)
        if case["name"] in LONG_CASES:
            prompt = [int(x) for x in rng.integers(0, config.vocab_size, LONG_LEN)]
            np.save(os.path.join(root, case["name"], f"oracle_{LONG_LEN}.npy"),
                    oracle(torch.tensor([prompt])).logits[0].numpy())
            meta["prompts"][LONG_LEN] = prompt
    # prompt length -> (prompt, ids, clear): the oracle's greedy ids, the logits
    # that chose them (oracle_greedy<n>.npy), and whether every step's top-2
    # margin was clear (else a near-tie may flip an id: ids are not judged).
    meta["greedy"] = {}
    for attempt in range(20):
        prompt = [int(x) for x in rng.integers(0, config.vocab_size, PROMPT_LENS[0])]
        ids, rows = greedy(oracle, prompt, NEW_TOKENS)
        if margin_ok(rows, float(np.std(rows))):
            break
    save_greedy(root, meta, PROMPT_LENS[0], prompt, ids, rows)
    if LONG_LEN in meta["prompts"]:
        prompt = meta["prompts"][LONG_LEN]
        try:
            ids, rows = greedy_cached(oracle, prompt, NEW_TOKENS)
        except Exception as e:  # the oracle's cache API, not lockstep: report and go on without it
            print(f"!! {case['name']}: no long greedy oracle ({type(e).__name__}: {e})", flush=True)
        else:
            save_greedy(root, meta, LONG_LEN, prompt, ids, rows)
    return meta


def save_greedy(root, meta, n, prompt, ids, rows):
    np.save(os.path.join(root, meta["name"], f"oracle_greedy{n}.npy"), rows)
    meta["greedy"][n] = (prompt, ids, margin_ok(rows, float(np.std(rows))))


def greedy_cached(model, prompt, new_tokens):
    """Greedy ids and the logits that chose them, decoding on transformers' KV cache."""
    ids, rows = [], []
    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
        for _ in range(new_tokens):
            logits = out.logits[0, -1]
            rows.append(logits.numpy())
            ids.append(int(torch.argmax(logits)))
            out = model(torch.tensor([[ids[-1]]]), past_key_values=out.past_key_values, use_cache=True)
    return ids, np.stack(rows)


def run(cmd, log):
    """Runs one command: stdout to LOG's .txt twin, stderr to LOG."""
    t = time.time()
    with open(log[:-4] + ".txt", "w") as out, open(log, "w") as err:
        rc = subprocess.call(cmd, stdout=out, stderr=err)
    return rc, time.time() - t


def tp_divides(cfg, size):
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    return heads % size == 0 and cfg["intermediate_size"] % size == 0 and (kv % size == 0 or size % kv == 0)


def mpirun(size):
    return ["env", "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "mpirun", "--oversubscribe",
            "--bind-to", "none", "-np", str(size)]


def lockstep_runs(exe, root, meta, case, tp_sizes):
    """(label, command, log, kind) for every lockstep run of one case."""
    d = os.path.join(root, meta["name"])
    model = os.path.join(d, "model")
    runs = []
    n = PROMPT_LENS[-1]
    ids = ",".join(map(str, meta["prompts"][n]))
    for size in (t for t in tp_sizes if tp_divides(case["cfg"], t)):
        for dtype in ("auto", "float32"):
            label = f"score{n}_tp{size}_cuda_{dtype}"
            out = os.path.join(d, f"{label}.npy")
            runs.append((label, mpirun(size) + [exe, "score", "--model", model, "--backend", "cuda", "--comm", "mpi",
                                                "--dtype", dtype, "--max-seq-len", MAX_SEQ, "--prompt-ids", ids,
                                                "--dump-logits", out],
                         os.path.join(d, f"{label}.log"), ("score", n, dtype, out)))
    for n, prompt in meta["prompts"].items():
        ids = ",".join(map(str, prompt))
        for backend, dtype in (("cuda", "auto"), ("cuda", "float32"), ("cpu", "float32")):
            label = f"score{n}_{backend}_{dtype}"
            out = os.path.join(d, f"{label}.npy")
            runs.append((label, [exe, "score", "--model", model, "--backend", backend, "--dtype", dtype,
                                 "--max-seq-len", MAX_SEQ, "--prompt-ids", ids, "--dump-logits", out],
                         os.path.join(d, f"{label}.log"), ("score", n, dtype, out)))
    for n, (prompt, _, _) in meta["greedy"].items():
        ids = ",".join(map(str, prompt))
        for dtype in ("float32", "auto"):
            label = f"greedy{n}_cuda_{dtype}"
            runs.append((label, [exe, "generate", "--model", model, "--backend", "cuda", "--dtype", dtype,
                                 "--max-seq-len", MAX_SEQ, "--max-step-tokens", "256", "--prompt-ids", ids,
                                 "--max-new-tokens", str(NEW_TOKENS), "--ignore-eos",
                                 "--dump-logits", os.path.join(d, f"{label}.npy")],
                         os.path.join(d, f"{label}.log"), ("greedy", n, dtype, os.path.join(d, f"{label}.npy"))))
    return runs


def tolerance(dtype):
    """Max |error| / std of the oracle's logits: 1e-3 in float32; 0.1 otherwise
    (auto on CUDA is 16-bit, also for a float32 checkpoint)."""
    return 1e-3 if dtype == "float32" else 0.1


def relative_error(got, ref, scale):
    """Max |got - ref| in units of `scale` (the std of the oracle's logits)."""
    return float(np.abs(got - ref).max() / scale)


def judge(root, meta, run_, rc):
    label, _, log, (kind, n, dtype, out) = run_
    name = meta["name"]
    if rc != 0:
        tail = open(log, errors="replace").read().strip().splitlines()[-1:] or ["(no output)"]
        return False, f"{name:26} {label:24} FAILED rc={rc}: {tail[0][:160]}"
    if kind == "score":
        ref = np.load(os.path.join(root, name, f"oracle_{n}.npy"))
        got = np.load(out).astype(np.float64)
        if got.shape != ref.shape:
            return False, f"{name:26} {label:24} shape {got.shape} != oracle {ref.shape}"
        err, tol = relative_error(got, ref, ref.std()), tolerance(dtype)
        agree = float((got.argmax(1) == ref.argmax(1)).mean() * 100)
        ok = err <= tol
        return ok, f"{name:26} {label:24} max|err|/std {err:.3g} (tol {tol:g}) argmax agree {agree:.1f}%"
    # The logits of every step up to the first id that differs (after it the
    # two decode different sequences) against the oracle's; the ids
    # themselves where the oracle's margins were clear, in float32.
    got = [int(t) for t in open(log[:-4] + ".txt").read().split()]
    _, want, clear = meta["greedy"][n]
    same = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), NEW_TOKENS))
    ref = np.load(os.path.join(root, name, f"oracle_greedy{n}.npy"))
    rows = np.load(out).astype(np.float64)[: same + 1]
    err, tol = relative_error(rows, ref[: len(rows)], ref.std()), tolerance(dtype)
    ok = err <= tol and (same == NEW_TOKENS or dtype != "float32" or not clear)
    judged = "judged" if clear and dtype == "float32" else "not judged: " + ("16-bit" if clear else "a near-tie")
    return ok, (f"{name:26} {label:24} max|err|/std {err:.3g} (tol {tol:g}) over {len(rows)} steps; greedy ids "
                f"equal to the oracle's: first {same} of {NEW_TOKENS} ({judged})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lockstep", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--tp", default="2,4", help="tensor-parallel sizes to score at (\"\" for none)")
    a = ap.parse_args()
    torch.set_num_threads(max(1, (os.cpu_count() or 4) - a.jobs))
    only = set(filter(None, a.only.split(",")))
    cases = [c for c in CASES if not only or c["name"] in only]
    results = []
    with cf.ThreadPoolExecutor(a.jobs) as pool:
        pending = []
        for case in cases:  # builds one case while the last one's lockstep runs go on
            t = time.time()
            meta = build_case(case, a.out)
            print(f"== built {case['name']} in {time.time() - t:.1f} s", flush=True)
            for r in lockstep_runs(a.lockstep, a.out, meta, case, [int(t) for t in a.tp.split(",") if t]):
                pending.append((meta, r, pool.submit(run, r[1], r[2])))
        for meta, r, fut in pending:
            rc, secs = fut.result()
            ok, line = judge(a.out, meta, r, rc)
            results.append(ok)
            print(("   " if ok else "!! ") + line + f" [{secs:.1f} s]", flush=True)
    bad = results.count(False)
    print(f"== oracle sweep: {len(results) - bad} of {len(results)} runs within tolerance, {bad} not")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
