#!/usr/bin/env python3
"""Sums ncu's per-kernel durations over the last decode step of a profile.

    tools/kernel_times.py [--layer] PROFILE.csv

PROFILE.csv: `ncu --metrics gpu__time_duration.sum --csv --print-units base`
over a `lockstep bench --eager` run. A decode step starts with the embedding
kernel (so does the gather of logit rows, a step of a few kernels); a decode
step is one whose attention runs the decode tiling (tensor-core kernel with
RowWarps 1) or the CUDA-core kernel, and the last of them is the one summed.
With --layer, for a profile limited to one layer's NVTX range (ncu --nvtx
--nvtx-include "layer 5/"), one period of that layer in decode is summed:
the kernels after the second-last decode attention up to the last one. Prints each kernel's launches and total microseconds, largest
first, and the step's total.
"""
import csv
import re
import sys
from collections import defaultdict


def launches(path):
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    for row in csv.DictReader(lines):
        if row.get("Metric Name") == "gpu__time_duration.sum":
            yield row["Kernel Name"], float(row["Metric Value"].replace(",", "")) / 1e3


def short(name):
    name = name.replace("(anonymous namespace)::", "").replace("lockstep::cuda::", "")
    name = re.sub(r"\(.*$", "", name)  # drop the argument list
    name = re.sub(r"^void ", "", name)
    return name[:70]


DECODE_ATTENTION = re.compile(r"attention_tensor_core_kernel<[^>]*, 1>|attention_kernel<")


def layer_period(kernels):
    marks = [i for i, (name, _) in enumerate(kernels) if DECODE_ATTENTION.search(name)]
    if len(marks) < 2:
        sys.exit(f"--layer needs two decode steps; found {len(marks)} decode attention kernels")
    return kernels[marks[-2] + 1:marks[-1] + 1]


def main():
    args = sys.argv[1:]
    layer = args[:1] == ["--layer"]
    kernels = list(launches(args[-1]))
    if layer:
        report(layer_period(kernels), "layer (sum of kernel durations)")
        return
    starts = [i for i, (name, _) in enumerate(kernels) if "embedding" in name]
    steps = [kernels[a:b] for a, b in zip(starts, starts[1:] + [len(kernels)])]
    decode = [s for s in steps if any(DECODE_ATTENTION.search(name) for name, _ in s)]
    if not decode:
        sys.exit(f"no decode step among {len(steps)} steps of {len(kernels)} kernels")
    report(decode[-1], "step (sum of kernel durations)")


def report(step, total_label):
    totals = defaultdict(lambda: [0, 0.0])
    for name, us in step:
        totals[short(name)][0] += 1
        totals[short(name)][1] += us
    print(f"{'kernel':70} {'launches':>8} {'total us':>10} {'us each':>9}")
    for name, (count, us) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:70} {count:8d} {us:10.1f} {us / count:9.2f}")
    print(f"{total_label:70} {len(step):8d} {sum(us for _, us in step):10.1f}")


if __name__ == "__main__":
    main()
