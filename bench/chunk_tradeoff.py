"""Chunk-size trade-off of Prefilling-dLLM: chunk size C x kept chunks K x context length.

    python -m bench.chunk_tradeoff [--chunk-sizes 64 128 256 512 1024] [--top-k 1 2 4 8] [--lengths 8192 32768]

Prefilling only, passkey and needle cases at a few depths on the bundled tiny model:
accuracy and seconds per case for every (C, K, length). Small C makes scoring finer
but cuts needles across chunks and adds scoring rows; large C x K pushes the query
past the model's 1536-token training window (continuous positions), which this
tiny model cannot extrapolate to. One untimed warm-up case runs first (:mod:`bench.warmup`).
Writes ``chunk_tradeoff.csv``, ``.md`` and ``.png`` to ``runs/bench/``; ``--record`` rewrites the
recorded ones in ``bench/results/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import time
from dataclasses import asdict

import torch

from bench.budget import TimeBudget
from bench.demo import TINY_PREFILLING
from bench.figures import save_figure
from bench.outputs import add_output_args, output_dir
from bench.provenance import write_csv
from bench.warmup import first_case_line, first_case_ratios, startup_line, warm_up
from dllm.evaluation import run_case
from dllm.loader import load_model
from dllm.tasks import make_case


def run(chunk_sizes, top_ks, lengths, depths, tasks, budget_s, out_dir, seed=2000):
    """Decode the grid; returns its rows (also written to ``chunk_tradeoff.csv``) and the start-up line."""
    t0 = time.perf_counter()
    model = load_model()
    load_s = time.perf_counter() - t0
    warm = warm_up(model, ("prefilling",), lengths[0], prefilling=TINY_PREFILLING)
    startup = startup_line(load_s, warm, lengths[0])
    print(startup, flush=True)
    budget = TimeBudget(budget_s)
    rows = []
    for length, c, k in itertools.product(lengths, chunk_sizes, top_ks):
        if k * c > length:
            continue
        key = f"C{c}K{k}"
        n = len(depths) * len(tasks)
        if budget.skip_reason(key, length, n, 1.0):
            continue
        cfg = dataclasses.replace(TINY_PREFILLING, chunk_size=c, top_k=k)  # same scoring as the demo
        t0 = time.perf_counter()
        for task in tasks:
            for i, d in enumerate(depths):
                case = make_case(task, length, d, seed + i, tokenizer=None)
                row = asdict(run_case(model, case, "prefilling", prefilling=cfg))
                rows.append({**row, "chunk_size": c, "top_k": k})
        budget.record(key, length, (time.perf_counter() - t0) / n)
        acc = sum(r["correct"] for r in rows[-n:]) / n
        print(f"  C={c:5d} K={k} @ {length:6d}: {100 * acc:.0f}% {budget.measured[key][1]:.2f} s/case", flush=True)
    write_csv(os.path.join(out_dir, "chunk_tradeoff.csv"), rows, "cpu")
    return rows, startup


def summarize(rows, chunk_sizes, top_ks, lengths) -> str:
    out = []
    for length in lengths:
        out.append(f"Context {length} tokens: accuracy % / seconds per case\n")
        out.append("| C \\ K | " + " | ".join(map(str, top_ks)) + " |")
        out.append("|---:|" + "---:|" * len(top_ks))
        for c in chunk_sizes:
            cells = []
            for k in top_ks:
                sel = [r for r in rows if r["length"] == length and r["chunk_size"] == c and r["top_k"] == k]
                cells.append(
                    f"{100 * sum(r['correct'] for r in sel) / len(sel):.0f} / "
                    f"{sum(r['seconds'] for r in sel) / len(sel):.2f}"
                    if sel
                    else "-"
                )
            out.append(f"| {c} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def plot(rows, chunk_sizes, top_ks, lengths, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(lengths), figsize=(5 * len(lengths), 7), squeeze=False)
    for li, length in enumerate(lengths):
        for k in top_ks:
            pts = []
            for c in chunk_sizes:
                sel = [r for r in rows if r["length"] == length and r["chunk_size"] == c and r["top_k"] == k]
                if sel:
                    pts.append(
                        (c, 100 * sum(r["correct"] for r in sel) / len(sel), sum(r["seconds"] for r in sel) / len(sel))
                    )
            if pts:
                axes[0][li].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"K={k}")
                axes[1][li].plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=f"K={k}")
        axes[0][li].set_title(f"{length} context tokens")
        axes[0][li].set_ylabel("accuracy %")
        axes[1][li].set_ylabel("seconds per case")
        for ax in (axes[0][li], axes[1][li]):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("chunk size C")
            ax.grid(alpha=0.3)
            ax.legend()
    save_figure(fig, path, "Prefilling-dLLM chunk-size trade-off (tiny-dream, CPU, passkey + needle)", dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chunk-sizes", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    p.add_argument("--top-k", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--lengths", type=int, nargs="+", default=[8192, 32768])
    p.add_argument("--depths", type=float, nargs="+", default=[0.1, 0.5, 0.9])
    p.add_argument("--tasks", nargs="+", default=["passkey", "needle"])
    p.add_argument("--budget", type=float, default=240.0, help="seconds of the timed grid")
    add_output_args(p, "bench")
    args = p.parse_args(argv)
    out = output_dir(args, "bench")
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    rows, startup = run(args.chunk_sizes, args.top_k, args.lengths, args.depths, args.tasks, args.budget, str(out))
    first = first_case_line(first_case_ratios(rows, key=("chunk_size", "top_k", "length")))
    table = f"{summarize(rows, args.chunk_sizes, args.top_k, args.lengths)}\n{startup} {first}"
    print(table)
    with open(out / "chunk_tradeoff.md", "w") as f:
        f.write(table + "\n")
    plot(rows, args.chunk_sizes, args.top_k, args.lengths, str(out / "chunk_tradeoff.png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
