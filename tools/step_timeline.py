#!/usr/bin/env python3
"""Where a graphed decode step's time goes, kernel by kernel, as it ran.

    tools/step_timeline.py [--steps N] TRACE.csv
    tools/step_timeline.py --prefill TRACE.csv

TRACE.csv: benchmarks/kernel_timeline.cpp's output for a run that replays a
decode graph (e.g. `lockstep bench --batch 32`). The kernels of one graph
launch share a correlation id; the last N launches with the decode step's
kernel count (the most common count among the largest launches) are taken.
For each kernel of the step: its median duration and the median gap since
the previous kernel ended (negative: it started before, i.e. programmatic
launch overlap). Kernels of the layers are folded by their position in the
layer (the period between decode attention kernels) and summed over layers;
the kernels before the first layer and after the last are listed alone.

--prefill: the eager steps instead (no graph; a step starts at the embedding
kernel), those with the most kernel time (at least half the largest's), the
first of them dropped as a warm-up (e.g. `lockstep bench --batch 1 --ctx 16
--steps 8 --prefill-runs 3 --no-pdl`; with PDL a kernel's duration includes
its wait for the one before). Each position in the layer: the median
duration and gap over the layers between the first and the last, and over
the steps.
"""
import csv
import shutil
import statistics
import subprocess
import sys
from collections import defaultdict


def read(path):
    groups = defaultdict(list)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["graph_id"] != "0":
                groups[row["correlation_id"]].append((int(row["start_ns"]), int(row["end_ns"]), row["name"]))
    return [sorted(g) for g in groups.values()]


def demangle(names):
    if not shutil.which("c++filt"):
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
    return dict(zip(names, out))


def short(name):
    name = name.replace("(anonymous namespace)::", "").replace("lockstep::cuda::", "").replace("void ", "")
    cut = name.find("(")
    return (name[:cut] if cut > 0 else name)[:64]


def fold_layers(labels, durations, gaps):
    """(label, count, us each, gap each) rows: the kernels before the first
    layer and after the last alone, the layers' kernels folded by position
    (the period between decode attention kernels); every kernel alone when
    the step has fewer than two attention kernels."""
    size = len(labels)
    marks = [i for i, n in enumerate(labels) if "attention" in n and "merge" not in n]
    if len(marks) < 2:
        print("fewer than two attention kernels: no layers folded")
        return [(labels[i], 1, durations[i], gaps[i]) for i in range(size)]
    period = marks[1] - marks[0]
    first = marks[0]
    while first > 0 and first - 1 + period < size and labels[first - 1] == labels[first - 1 + period]:
        first -= 1
    layers = min(len(marks), (size - first) // period)
    end = first + layers * period
    print(f"{layers} layers of {period} kernels from kernel {first}")
    rows = [(labels[i], 1, durations[i], gaps[i]) for i in range(first)]
    for j in range(period):
        idx = [first + j + period * n for n in range(layers)]
        rows.append((labels[first + j], layers, statistics.mean(durations[i] for i in idx),
                     statistics.mean(gaps[i] for i in idx)))
    return rows + [(labels[i], 1, durations[i], gaps[i]) for i in range(end, size)]


def eager_steps(path):
    """The eager kernels of the trace, cut into steps at each embedding kernel."""
    rows = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["graph_id"] == "0":
                rows.append((int(row["start_ns"]), int(row["end_ns"]), row["name"]))
    rows.sort()
    names = demangle(sorted({r[2] for r in rows}))
    steps, current = [], []
    for start, end, name in rows:
        label = short(names[name])
        if "embedding" in label and current:
            steps.append(current)
            current = []
        current.append((start, end, label))
    return steps + [current] if current else steps


def prefill_main(path):
    steps = eager_steps(path)
    busy = [sum(e - s for s, e, _ in st) for st in steps]
    if not steps:
        sys.exit("no eager kernels in the trace")
    chosen = [st for st, b in zip(steps, busy) if b >= max(busy) / 2][1:]
    if not chosen:
        sys.exit("one large eager step only (the warm-up): time more prefill runs")
    print(f"{len(chosen)} prefill steps; first start to last end (ms): " +
          " ".join(f"{(st[-1][1] - st[0][0]) / 1e6:.2f}" for st in chosen))
    per = defaultdict(list)
    for st in chosen:
        marks = [i for i, (_, _, n) in enumerate(st) if "attention" in n and "merge" not in n]
        if len(marks) < 3:
            sys.exit("fewer than three attention kernels a step: no layers to fold")
        period = marks[1] - marks[0]
        for m in marks[1:-1]:
            for j in range(period):
                start, end, label = st[m + j]
                per[j].append((label, (end - start) / 1e3, (start - st[m + j - 1][1]) / 1e3))
    total = 0.0
    print(f"{'kernel':66s} {'us each':>8s} {'gap each':>8s}")
    for j in sorted(per):
        d = statistics.median(x[1] for x in per[j])
        gap = statistics.median(x[2] for x in per[j])
        total += d + max(gap, 0.0)
        print(f"{per[j][0][0]:66s} {d:8.1f} {gap:8.1f}")
    print(f"a layer, positive gaps included: {total:.1f} us")


def main():
    args = sys.argv[1:]
    if args[:1] == ["--prefill"]:
        prefill_main(args[1])
        return
    steps = 20
    if args[:1] == ["--steps"]:
        steps, args = int(args[1]), args[2:]
    launches = read(args[0])
    if not launches:
        sys.exit("no graph-launched kernels in the trace")
    largest = max(len(g) for g in launches)
    counts = [len(g) for g in launches if len(g) > largest // 2]
    size = statistics.mode(counts)
    chosen = [g for g in launches if len(g) == size][-steps:]
    names = demangle(sorted({k[2] for g in chosen for k in g}))
    step_ms = [(g[-1][1] - g[0][0]) / 1e6 for g in chosen]
    durations = [statistics.median((g[i][1] - g[i][0]) / 1e3 for g in chosen) for i in range(size)]
    gaps = [0.0] + [statistics.median((g[i][0] - g[i - 1][1]) / 1e3 for g in chosen) for i in range(1, size)]
    labels = [short(names[k[2]]) for k in chosen[-1]]
    print(f"{len(chosen)} launches of {size} kernels; step (first start to last end) median "
          f"{statistics.median(step_ms):.3f} ms, min {min(step_ms):.3f}")
    rows = fold_layers(labels, durations, gaps)
    print(f"{'kernel':66s} {'count':>5s} {'us each':>8s} {'gap each':>8s} {'total us':>9s}")
    for label, n, d, gap in rows:
        print(f"{label:66s} {n:5d} {d:8.2f} {gap:8.2f} {n * (d + gap):9.1f}")
    print(f"sum of durations {sum(durations) / 1e3:.3f} ms, of gaps {sum(gaps) / 1e3:.3f} ms "
          f"(negative: overlap)")


if __name__ == "__main__":
    main()
