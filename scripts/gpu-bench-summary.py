#!/usr/bin/env python3
"""The summary of scripts/gpu-device-bench.sh: its JSON results as tables.

    scripts/gpu-bench-summary.py RESULTS_DIR PEAK_GBS
"""
import json
import os
import re
import sys

BENCHES = ["spec-gpu-draft", "spec-cpu-draft", "ar-q8_0", "spec-gpu-draft-f16", "long-128", "long-0", "spec-0.5b-draft"]


def load(res, name):
    try:
        with open(os.path.join(res, name + ".json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def cell(v, width, spec=".2f"):
    return ("-" if v is None else format(v, spec)).rjust(width)


def kernels(k, peak, how):
    """Each matmul's GB/s, share of the peak and time per call by rows, weights read from memory."""
    print(f"{k['backend']}, {how}: matmul GB/s (% of {peak:.0f} GB/s) and time per call, weights read from memory")
    table = {}
    for r in k["kernels"]:
        if r["kernel"].startswith("matmul") and r["weights"] == "memory":
            m, n, kk = map(int, re.findall(r"\d+", r["shape"]))
            table.setdefault((r["kernel"].split()[1], n, kk), {})[m] = r
    ms = sorted({m for row in table.values() for m in row})
    print(f"{'type':<6} {'n x k':>13} " + " ".join(f"M={m}".rjust(27) for m in ms))
    for (dtype, n, kk), row in table.items():
        cells = [
            f"{row[m]['gb_per_s']:8.1f} ({100 * row[m]['gb_per_s'] / peak:5.1f}%) {row[m]['ms'] * 1e3:7.1f} us"
            if m in row
            else " " * 27
            for m in ms
        ]
        print(f"{dtype:<6} {f'{n}x{kk}':>13} " + " ".join(cells))


def attention(res):
    """The attention kernel's time per call by rows, its walk split (128 slots per part) and not."""
    times = {}
    for split in (128, 0):
        try:
            with open(os.path.join(res, f"attention-{split}.json")) as f:
                first = json.loads(f.readline())
        except (OSError, ValueError):
            continue
        for r in first["kernels"]:
            if r["kernel"] == "attention":
                times.setdefault(r["shape"], {})[split] = r["ms"]
    if times:
        print("\nattention, ms per call: split into 128-slot parts / unsplit")
        for shape, t in times.items():
            print(f"{shape:<40} {cell(t.get(128), 8, '.3f')} {cell(t.get(0), 8, '.3f')}")


def bench(name, b):
    """Each mode's speed and what its round costs: ms per round is tokens per round over tokens/s."""
    print(f"\n{name}: one target decode {b['decode_ms'] or 0:.2f} ms; greedy outputs agree: {b['outputs_agree']}")
    print(f"{'mode':<5} {'K':>2} {'tok/s':>8} {'vs AR':>6} {'ms/round':>9} {'tok/round':>9} {'verify ms':>9} "
          f"{'draft step':>10} {'glue ms':>8} {'accept':>6}")
    for r in b["modes"]:
        per_round = r["mean_accepted"] or 1.0
        print(f"{r['mode']:<5} {cell(r['k'], 2, 'd')} {r['tokens_per_s']:8.1f} {cell(r['speedup_vs_ar'], 6)} "
              f"{1000 * per_round / r['tokens_per_s']:9.2f} {per_round:9.2f} {cell(r['verify_ms'], 9)} "
              f"{cell(r['draft_step_ms'], 10)} {cell(r['glue_ms_mean'], 8)} {cell(r['acceptance_rate'], 6)}")


def main():
    res, peak = sys.argv[1], float(sys.argv[2])
    # One JSON line per path the kernels took (with subgroups, then without, then with f16
    # arithmetic, where offered).
    for name, how in (("kernels", "default workgroups"), ("kernels-32", "32-thread decode workgroups")):
        try:
            with open(os.path.join(res, name + ".json")) as f:
                runs = [json.loads(line) for line in f if line.strip()]
        except (OSError, ValueError):
            runs = []
        for k in runs:
            kernels(k, peak, how)
    attention(res)
    for name in BENCHES:
        b = load(res, name)
        if b:
            bench(name, b)


main()
