"""Chunk-size trade-off of Prefilling-dLLM: chunk size C x kept chunks K x context length.

    python -m bench.studies.chunk_tradeoff [--chunk-sizes 64 128 256 512 1024] [--top-k 1 2 4 8] [--lengths 8192 32768]

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
import itertools
import os
import time
from dataclasses import asdict

from bench.budget import TimeBudget
from bench.outputs import parse_study, write_report
from bench.plotting import dodge, mark_not_run, save_figure, token_axis, tokens_label
from bench.provenance import write_csv
from bench.tiny_defaults import TINY_PREFILLING
from bench.warmup import first_case_line, first_case_ratios, startup_line, warm_up
from dllm.eval.evaluation import run_case
from dllm.eval.tasks import make_case
from dllm.model.loader import load_model
from dllm.prefilling.config import with_overrides


def run(chunk_sizes, top_ks, lengths, depths, tasks, budget_s, out_dir, seed=2000):
    """Decode the grid; returns its rows (also written to ``chunk_tradeoff.csv``) and the start-up line."""
    t0 = time.perf_counter()
    model = load_model()
    load_s = time.perf_counter() - t0
    # the warm-up decodes the grid's first cell (TINY_PREFILLING's K=4 of C=256 does not fit a short first length)
    first = next(((c, k) for c, k in itertools.product(chunk_sizes, top_ks) if k * c <= lengths[0]), None)
    warm_cfg = (
        with_overrides(TINY_PREFILLING, {"chunk_size": first[0], "top_k": first[1], "adaptive_k": None})
        if first
        else with_overrides(TINY_PREFILLING, {"top_k": None, "adaptive_k": None})
    )
    warm = warm_up(model, ("prefilling",), lengths[0], prefilling=warm_cfg)
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
        # same scoring as the demo; the snap tolerance kept as the same share of each C (64 of 256 -> 16 of 64);
        # K fixed (adaptive K off): the grid measures K itself
        cfg = with_overrides(TINY_PREFILLING, {"chunk_size": c, "top_k": k, "adaptive_k": None})
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


def plot(rows, chunk_sizes, top_ks, lengths, path, task: str = "passkey"):
    """Accuracy and seconds per case of ``task`` against the chunk size C, one line per K and one column per
    context length. Only ``task`` is drawn: averaging in a task the model always fails (the bundled model
    answers no needle case) would cap the curves and hide the trade-off; the caption says how the other
    tasks did. Lines of different K are dodged sideways (equal values stay visible); a (C, K) that was not
    run (the time budget skipped it, or K x C exceeds the context) is an x on the axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    others = sorted({r["task"] for r in rows} - {task})
    fig, axes = plt.subplots(2, len(lengths), figsize=(5 * len(lengths), 7.4), squeeze=False)
    styles = ("o-", "s--", "^-.", "D:")
    for li, length in enumerate(lengths):
        for ki, k in enumerate(top_ks):
            pts, missing = [], []
            for c in chunk_sizes:
                sel = [
                    r for r in rows
                    if r["task"] == task and r["length"] == length and r["chunk_size"] == c and r["top_k"] == k
                ]  # fmt: skip
                if not sel:
                    missing.append(dodge(c, ki, len(top_ks)))
                    continue
                n = len(sel)
                pts.append((dodge(c, ki, len(top_ks)), 100 * sum(r["correct"] for r in sel) / n,
                            sum(r["seconds"] for r in sel) / n))  # fmt: skip
            color = f"C{ki}"
            for row, ax in enumerate((axes[0][li], axes[1][li])):
                mark_not_run(ax, missing, color=color)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1 + row] for p in pts], styles[ki % len(styles)], color=color,
                            label=f"K={k}")  # fmt: skip
        axes[0][li].set_title(f"{tokens_label(length)} context tokens")
        axes[0][li].set_ylabel(f"{task} accuracy (% of cases)")
        axes[0][li].set_ylim(-5, 105)
        axes[1][li].set_ylabel("seconds per case (s)")
        for ax in (axes[0][li], axes[1][li]):
            token_axis(ax, chunk_sizes, label="chunk size C (tokens)")
            ax.grid(alpha=0.3)
        axes[0][li].plot([], [], ls="none", marker="x", mew=2, color="grey", label="not run")
        axes[0][li].legend(fontsize=8)
    caption = "x on the axis: not run (the time budget skipped it). Lines of different K are shifted sideways slightly."
    for other in others:
        sel = [r for r in rows if r["task"] == other]
        caption += (
            f"\n{other}: {sum(r['correct'] for r in sel)} of {len(sel)} cases correct over all settings "
            "(not drawn: the bundled model cannot do this task)"
        )
    save_figure(
        fig,
        path,
        f"Prefilling-dLLM chunk size C x kept chunks K: bundled tiny-dream on CPU, {task}",
        dpi=110,
        caption=caption,
    )


DEFAULTS = {"chunk_sizes": [64, 128, 256, 512, 1024], "top_k": [1, 2, 4, 8], "lengths": [8192, 32768]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chunk-sizes", type=int, nargs="+", default=DEFAULTS["chunk_sizes"])
    p.add_argument("--top-k", type=int, nargs="+", default=DEFAULTS["top_k"])
    p.add_argument("--lengths", type=int, nargs="+", default=DEFAULTS["lengths"])
    p.add_argument("--depths", type=float, nargs="+", default=[0.1, 0.5, 0.9])
    p.add_argument("--tasks", nargs="+", default=["passkey", "needle"])
    p.add_argument("--budget", type=float, default=240.0, help="seconds of the timed grid")
    args, out = parse_study(p, argv)
    t0 = time.perf_counter()
    rows, startup = run(args.chunk_sizes, args.top_k, args.lengths, args.depths, args.tasks, args.budget, str(out))
    first = first_case_line(first_case_ratios(rows, key=("chunk_size", "top_k", "length")))
    title = "Chunk size C x top-K: accuracy and seconds per case on the bundled tiny model"
    paragraphs = [summarize(rows, args.chunk_sizes, args.top_k, args.lengths).rstrip(), f"{startup} {first}"]
    seconds = time.perf_counter() - t0
    write_report(out / "chunk_tradeoff.md", title, "bench.studies.chunk_tradeoff", argv, "cpu", seconds, paragraphs)
    plot(rows, args.chunk_sizes, args.top_k, args.lengths, str(out / "chunk_tradeoff.png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
