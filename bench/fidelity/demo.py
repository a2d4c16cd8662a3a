"""``make demo`` / ``python -m bench.fidelity.demo``: passkey retrieval at 4K-32K tokens, three methods, one table.

On the bundled tiny model, for context lengths 4K, 8K, 16K and 32K tokens and
needle depths 0, 25, 50, 75 and 100%, each case is decoded with ``dense`` (the
transformers baseline), ``prefix_cache`` (Fast-dLLM style) and ``prefilling``
(this package). The table reports accuracy, mean seconds per case and the
speedup over dense measured in the same run. A method whose predicted time at
the next length (its measured time scaled by the method's cost law: quadratic in
the context for dense and prefix_cache, linear for prefilling) would not fit the
time budget is skipped, and the table says so. One untimed warm-up case per method runs first; its
time and the model's load time are reported apart (:mod:`bench.warmup`), with the first case of
each row over that row's median. Writes a CSV, a Markdown table and a PNG to ``runs/demo/``
(git-ignored); ``--record`` (``make record``) rewrites the recorded ``bench/results/demo/`` instead.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict

from bench.budget import TimeBudget
from bench.fidelity.selection_recall import write_recall
from bench.outputs import add_output_args, output_dir
from bench.plotting import dodge, mark_not_run, save_figure, token_axis
from bench.provenance import machine_line, write_csv
from bench.tiny_defaults import EXPONENT, TINY_PREFILLING
from bench.warmup import first_case_line, first_case_ratios, startup_line, warm_up
from dllm.eval.evaluation import EvalRow, run_case
from dllm.eval.tasks import make_case
from dllm.model.loader import load_model
from dllm.prefilling import PrefillingConfig

LENGTHS = (4096, 8192, 16384, 32768)
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
METHODS = ("prefilling", "prefix_cache", "dense")  # cheapest first: a spent budget skips the costly ones
GEN = dict(gen_length=8, steps=8)  # a 5-digit key and its EOS, one token per step


def run_demo(
    out_dir: str,
    *,
    quick: bool = False,
    model_dir: str | None = None,
    budget_s: float = 540.0,
    lengths=LENGTHS,
    depths=DEPTHS,
    prefilling: PrefillingConfig | None = None,
    seed: int = 0,
    command: str = "python -m bench.fidelity.demo",
    methods=METHODS,
) -> int:
    """Run the demo grid and print the table; returns a process exit code (0).

    Args:
        out_dir: where ``demo.csv``, ``demo.md``, ``demo_recall.md`` and ``demo.png`` go.
        quick: 2 lengths x 2 depths (smoke test).
        model_dir: checkpoint (default: the bundled tiny model).
        budget_s: wall-clock budget; methods predicted to overrun it are skipped.
        lengths, depths: the grid (tokens; 0..1).
        prefilling: prefilling configuration (default: :data:`TINY_PREFILLING`).
        seed: first task seed (the case at depth index i uses ``seed + i``; one case per depth).
        command: the command line named in ``demo.md``.
        methods: a subset of :data:`METHODS` (run in :data:`METHODS`' order; the table's speedup needs dense).

    Raises:
        ValueError: an unknown method or none, an empty grid.
    """
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods or not lengths or not depths:
        raise ValueError(f"methods must be a non-empty subset of {METHODS} and the grid non-empty, got {methods}")
    methods = tuple(m for m in METHODS if m in methods)
    if quick:
        lengths, depths = lengths[:2], (depths[0], depths[-1])
    t0 = time.perf_counter()
    model = load_model(model_dir)
    load_s = time.perf_counter() - t0
    cfg = prefilling or TINY_PREFILLING
    warm = warm_up(model, methods, lengths[0], prefilling=cfg, **GEN)
    startup = startup_line(load_s, warm, lengths[0])
    print(startup, flush=True)
    budget = TimeBudget(budget_s)  # starts after the warm-up: the budget is for the timed grid
    rows: list[EvalRow] = []
    for length in lengths:
        cases = [make_case("passkey", length, d, seed + i, tokenizer=None) for i, d in enumerate(depths)]
        for method in methods:
            if budget.skip_reason(method, length, len(cases), EXPONENT[method]):
                continue
            kw = {"prefilling": cfg} if method == "prefilling" else {}
            t0 = time.perf_counter()
            new = [run_case(model, case, method, **GEN, **kw) for case in cases]
            rows += new
            budget.record(method, length, (time.perf_counter() - t0) / len(cases))
            print(
                f"  {method:>12} @ {length:>6}: {sum(r.correct for r in new)}/{len(new)} correct, "
                f"{budget.measured[method][1]:.2f} s/case",
                flush=True,
            )
    skipped = budget.skipped
    os.makedirs(out_dir, exist_ok=True)
    write_csv(os.path.join(out_dir, "demo.csv"), [asdict(r) for r in rows], str(model.device))
    table = demo_table(rows, skipped, lengths, methods)
    first = first_case_line(first_case_ratios(rows))
    print(table)
    print(first)
    with open(os.path.join(out_dir, "demo.md"), "w") as f:
        f.write(
            f"Command: `{command}`  \n{machine_line(str(model.device))}\n\n{table}\n\n"
            f"Seconds per case: `generate`'s total, after the warm-up. {startup} {first}\n"
        )
    plot_demo(rows, os.path.join(out_dir, "demo.png"), lengths)
    write_recall(os.path.join(out_dir, "demo.csv"), cfg.chunk_size, cfg.boundary_snap)
    print(
        f"timed grid {budget.seconds - budget.left():.0f} s, start-up {load_s + sum(warm.values()):.0f} s; "
        f"wrote {out_dir}/demo.csv, demo.md, demo_recall.md, demo.png"
    )
    return 0


def _get(row, key):
    return row[key] if isinstance(row, dict) else getattr(row, key)


def _cell(rows, method, length):
    sel = [r for r in rows if _get(r, "method") == method and _get(r, "length") == length]
    if not sel:
        return None
    n = len(sel)
    return 100.0 * sum(_get(r, "correct") for r in sel) / n, sum(_get(r, "seconds") for r in sel) / n, n


def demo_table(rows, skipped, lengths, methods=METHODS) -> str:
    """Markdown: per length and method (of ``methods``), accuracy, seconds per case and speedup over dense (same
    run)."""
    lines = [
        "| context tokens | method | passkey accuracy % | s / case | speedup vs dense |",
        "|---:|---|---:|---:|---:|",
    ]
    for length in lengths:
        dense = _cell(rows, "dense", length)
        for method in methods:
            c = _cell(rows, method, length)
            if c is None:
                reason = skipped.get((method, length), "not run")
                lines.append(f"| {length} | {method} | - | - | {reason} |")
                continue
            acc, secs, n = c
            speed = f"{dense[1] / secs:.1f}x" if dense else "dense not run"
            lines.append(f"| {length} | {method} | {acc:.0f} ({n} cases) | {secs:.2f} | {speed} |")
    return "\n".join(lines)


def plot_demo(rows, path: str, lengths=None) -> None:
    """Accuracy and seconds per case vs context length, one line per method (:class:`EvalRow` or the rows
    of ``demo.csv`` as dicts). A method not run at a length of the grid (``lengths``, default every length
    in ``rows``; the time budget skipped it) is a grey-edged x on the axis; the accuracy points are dodged
    sideways so that equal values (0 % for both baselines) stay visible."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = sorted(set(lengths or ()) | {_get(r, "length") for r in rows})
    fig, (ax_acc, ax_t) = plt.subplots(1, 2, figsize=(10, 4.4))
    styles = {"prefilling": ("o", "-"), "prefix_cache": ("s", "--"), "dense": ("^", ":")}
    for i, method in enumerate(METHODS):
        marker, ls = styles[method]
        lens = [ln for ln in lengths if _cell(rows, method, ln) is not None]
        skipped = [ln for ln in lengths if ln not in lens]
        color = f"C{i}"
        for ax in (ax_acc, ax_t):
            mark_not_run(ax, [dodge(x, i, len(METHODS)) for x in skipped], color=color)
        if not lens:
            continue
        cells = [_cell(rows, method, ln) for ln in lens]
        ax_acc.plot([dodge(x, i, len(METHODS)) for x in lens], [c[0] for c in cells], marker=marker, ls=ls,
                    color=color, label=method)  # fmt: skip
        ax_t.plot(lens, [c[1] for c in cells], marker=marker, ls=ls, color=color, label=method)
    for ax, ylabel, title in (
        (ax_acc, "passkey accuracy (% of cases)", "accuracy (5 depths per length)"),
        (ax_t, "seconds per case (s, log scale)", "time per case (generate's total)"),
    ):
        token_axis(ax, lengths)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    ax_acc.plot([], [], ls="none", marker="x", mew=2, color="grey", label="not run (time budget)")
    ax_acc.legend(fontsize=8, loc="center right")  # one legend: the same methods in both panels
    ax_acc.set_ylim(-5, 105)
    ax_t.set_yscale("log")
    save_figure(
        fig,
        path,
        "Demo: bundled tiny-dream on CPU, passkey retrieval: dense vs prefix_cache vs prefilling",
        dpi=120,
        caption="x on the axis: not run at that length (predicted past the time budget). Accuracy points are "
        "shifted sideways slightly so that equal values stay visible.",
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="checkpoint directory (default: the bundled tiny model)")
    add_output_args(p, "demo", "demo")
    p.add_argument("--quick", action="store_true", help="2 lengths x 2 depths (smoke test)")
    p.add_argument(
        "--budget", type=float, default=540.0, help="seconds of the timed grid; slower methods are skipped past it"
    )
    p.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS), help="context lengths in tokens")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS), help="the methods to run")
    args = p.parse_args(argv)
    if any(n < 1 for n in args.lengths):
        p.error(f"--lengths must be >= 1 token, got {args.lengths}")
    command = " ".join(["python -m bench.fidelity.demo", *(sys.argv[1:] if argv is None else argv)])
    return run_demo(
        str(output_dir(args, "demo", "demo")),
        quick=args.quick,
        model_dir=args.model,
        budget_s=args.budget,
        command=command,
        lengths=tuple(args.lengths),
        methods=tuple(args.methods),
    )


if __name__ == "__main__":
    raise SystemExit(main())
