"""Lost in the middle: accuracy over needle depth x context length, per method, as heatmaps.

    python -m bench.fidelity.lost_in_middle [--tasks passkey needle] [--lengths ...] [--depths 11] [--budget 300]

For each task, method (dense, prefix_cache, prefilling), context length and needle
depth (11 depths 0..1 by default) one seeded case is decoded on the bundled tiny
model. Cells a method could not reach within the time budget are grey ("not run"). One untimed
warm-up case per method runs first (:mod:`bench.warmup`). Writes ``lost_in_middle.csv``, ``.md``
and ``.png`` to ``runs/bench/``; ``--record`` rewrites the recorded ones in ``bench/results/``.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import asdict

from bench.budget import TimeBudget
from bench.outputs import parse_study, write_report
from bench.plotting import save_figure, tokens_label
from bench.provenance import write_csv
from bench.tiny_defaults import EXPONENT, TINY_PREFILLING
from bench.warmup import first_case_line, first_case_ratios, startup_line, warm_up
from dllm.eval.evaluation import run_case
from dllm.eval.tasks import make_case
from dllm.model.loader import load_model

METHODS = ("prefilling", "prefix_cache", "dense")  # cheapest first: a spent budget skips the costly ones


def run(tasks, lengths, depths, budget_s, out_dir, seed=1000):
    """Decode the grid; returns its rows (also written to ``lost_in_middle.csv``), the skipped cells and
    the start-up line."""
    t0 = time.perf_counter()
    model = load_model()
    load_s = time.perf_counter() - t0
    warm = dict.fromkeys(METHODS, 0.0)
    for task in tasks:  # each task's answer length gives its decode other shapes
        for method, s in warm_up(model, METHODS, lengths[0], prefilling=TINY_PREFILLING, task=task).items():
            warm[method] += s
    startup = startup_line(load_s, warm, lengths[0], per="method and task" if len(tasks) > 1 else "method")
    print(startup, flush=True)
    budget = TimeBudget(budget_s)
    rows = []
    for length in lengths:
        for method in METHODS:
            n = len(depths) * len(tasks)
            if budget.skip_reason(method, length, n, EXPONENT[method]):
                continue
            t0 = time.perf_counter()
            for task in tasks:
                for i, d in enumerate(depths):
                    case = make_case(task, length, d, seed + i, tokenizer=None)
                    kw = {"prefilling": TINY_PREFILLING} if method == "prefilling" else {}
                    rows.append(asdict(run_case(model, case, method, **kw)))
            budget.record(method, length, (time.perf_counter() - t0) / n)
            print(f"  {method:>12} @ {length:>6}: {budget.measured[method][1]:.2f} s/case", flush=True)
    write_csv(os.path.join(out_dir, "lost_in_middle.csv"), rows, "cpu")
    return rows, budget.skipped, startup


def summarize(rows, tasks, lengths) -> str:
    lines = ["| task | method | " + " | ".join(str(ln) for ln in lengths) + " |", "|---|---|" + "---:|" * len(lengths)]
    for task in tasks:
        for method in METHODS:
            cells = []
            for ln in lengths:
                sel = [r for r in rows if r["task"] == task and r["method"] == method and r["length"] == ln]
                cells.append(f"{100 * sum(r['correct'] for r in sel) / len(sel):.0f}" if sel else "not run")
            lines.append(f"| {task} | {method} | " + " | ".join(cells) + " |")
    return "Accuracy % over all depths, per context length (tokens):\n\n" + "\n".join(lines)


def plot(rows, tasks, lengths, depths, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(len(tasks), len(METHODS), figsize=(4.2 * len(METHODS), 3.4 * len(tasks)), squeeze=False)
    cmap = plt.get_cmap("RdYlGn").with_extremes(bad="lightgrey")
    for ti, task in enumerate(tasks):
        for mi, method in enumerate(METHODS):
            grid = np.full((len(depths), len(lengths)), np.nan)
            for r in rows:
                if r["task"] == task and r["method"] == method:
                    di = min(range(len(depths)), key=lambda i: abs(depths[i] - r["depth"]))
                    grid[di, lengths.index(r["length"])] = 100.0 * r["correct"]
            ax = axes[ti][mi]
            ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=100, aspect="auto", origin="upper")
            ax.set_xticks(range(len(lengths)), [tokens_label(ln) for ln in lengths])
            ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths], fontsize=7)
            ax.set_title(f"{task} / {method}")
            ax.set_xlabel("context length (tokens)")
            if mi == 0:
                ax.set_ylabel("needle depth (% of the context)")
    save_figure(
        fig,
        path,
        "Where the needle sits vs whether it is found: bundled tiny-dream on CPU",
        dpi=110,
        caption="green: correct, red: wrong, grey: not run (the time budget skipped it); one case per cell",
    )


DEFAULTS = {"tasks": ["passkey", "needle"], "lengths": [1024, 2048, 4096, 8192, 16384, 32768], "depths": 11}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=DEFAULTS["tasks"])
    p.add_argument("--lengths", type=int, nargs="+", default=DEFAULTS["lengths"])
    p.add_argument("--depths", type=int, default=DEFAULTS["depths"], help="number of depths in 0..1")
    p.add_argument("--budget", type=float, default=300.0, help="seconds of the timed grid")
    args, out = parse_study(p, argv)
    t0 = time.perf_counter()
    depths = [i / (args.depths - 1) for i in range(args.depths)]
    rows, skipped, startup = run(args.tasks, args.lengths, depths, args.budget, str(out))
    first = first_case_line(first_case_ratios(rows, key=("task", "method", "length")))
    paragraphs = [
        summarize(rows, args.tasks, args.lengths),
        "Skipped: " + ("; ".join(f"{m}@{ln}: {why}" for (m, ln), why in skipped.items()) or "none"),
        f"{startup} {first}",
    ]
    title = "Lost in the middle: needle depth x context length on the bundled tiny model"
    seconds = time.perf_counter() - t0
    write_report(out / "lost_in_middle.md", title, "bench.fidelity.lost_in_middle", argv, "cpu", seconds, paragraphs)
    plot(rows, args.tasks, args.lengths, depths, str(out / "lost_in_middle.png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
