"""End-to-end speed vs context length on the bundled tiny model, beside the FLOP model.

    python -m bench.speed.e2e_speed [--lengths 2048 4096 ... 65536] [--depths 0.1 0.5 0.9] [--budget 600]

For every context length and method (dense, prefix_cache, prefilling) it decodes
passkey cases (one per depth; accuracy reported beside every time) and records total
time, prefill / scoring / decode time, per-step decode time and NFE, plus the FLOP
model's prediction (:mod:`bench.speed.flop_model`). Methods whose predicted time would
overrun the budget are skipped at that length (listed in the table). Dense's per-step
cost is additionally probed with one forward at every length where it fits, so its
growth can be read even where full decoding is skipped.

One untimed warm-up case per method runs first (:mod:`bench.warmup`); its time is reported apart.
Writes ``e2e_speed.csv``, ``e2e_speed.md`` and ``e2e_speed.png`` (log-log) to ``runs/bench/``;
``--record`` rewrites the recorded ones in ``bench/results/``.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from bench.budget import TimeBudget
from bench.outputs import parse_study, write_report
from bench.plotting import dodge, mark_not_run, save_figure, token_axis
from bench.provenance import write_csv
from bench.speed import flop_model
from bench.tiny_defaults import EXPONENT, TINY_PREFILLING
from bench.warmup import first_case_line, first_case_ratios, startup_line, warm_up
from dllm.eval.evaluation import case_inputs
from dllm.eval.tasks import make_case, score
from dllm.generate import generate
from dllm.model.loader import load_model
from dllm.model.tokenization import encode_text
from dllm.prefilling import PromptParts

METHODS = ("prefilling", "prefix_cache", "dense")  # cheapest first: a spent budget skips the costly ones
GEN, STEPS = 8, 8


def predicted_flops(model, case_parts, method, cfg=TINY_PREFILLING) -> dict:
    arch = flop_model.Arch.of(model.config)
    p, c, q = (t.numel() for t in case_parts)
    if method == "dense":
        return flop_model.dense_flops(arch, p + c + q, GEN, STEPS)
    if method == "prefix_cache":
        return flop_model.prefix_cache_flops(arch, p + c + q, GEN, STEPS)
    return flop_model.prefilling_flops(
        arch, p, c, q, GEN, STEPS, cfg.chunk_size, cfg.top_k, cfg.token_budget, cfg.draft_tokens
    )


def dense_step_probe(model, n_tokens: int) -> float:
    """Seconds of one dense forward over ``n_tokens`` (one denoising step of the baseline)."""
    ids = torch.randint(4, model.config.vocab_size, (1, n_tokens))
    with torch.no_grad():
        t0 = time.perf_counter()
        model(ids, torch.arange(n_tokens), logits_start=n_tokens - GEN)
        return time.perf_counter() - t0


def run(lengths, depths, budget_s: float, out_dir: str) -> tuple[list[dict], str]:
    """Decode the grid; returns its rows (also written to ``e2e_speed.csv``) and the start-up line."""
    t0 = time.perf_counter()
    model = load_model()
    load_s = time.perf_counter() - t0
    warm = warm_up(model, METHODS, lengths[0], prefilling=TINY_PREFILLING, gen_length=GEN, steps=STEPS)
    startup = startup_line(load_s, warm, lengths[0])
    print(startup, flush=True)
    budget = TimeBudget(budget_s)
    rows = []
    probe_budget = TimeBudget(budget_s * 0.25)
    for length in lengths:
        cases = [make_case("passkey", length, d, i, tokenizer=None) for i, d in enumerate(depths)]
        parts = PromptParts(
            encode_text(model, cases[0].prefix, bos=True),
            encode_text(model, cases[0].context),
            encode_text(model, cases[0].query),
        )
        for method in METHODS:
            reason = budget.skip_reason(method, length, len(cases), EXPONENT[method])
            flops = predicted_flops(model, (parts.prefix, parts.context, parts.query), method)
            if reason:
                rows.append(
                    {"length": length, "method": method, "status": reason, "flops_total": flop_model.total(flops)}
                )
                continue
            t0 = time.perf_counter()
            for case in cases:
                kw = {"prefilling": TINY_PREFILLING} if method == "prefilling" else {}
                res = generate(
                    model, **case_inputs(model, case, method), method=method, gen_length=GEN, steps=STEPS, **kw
                )
                sec = res.stats.seconds
                rows.append(
                    {
                        "length": length,
                        "method": method,
                        "status": "ok",
                        "depth": case.depth,
                        "correct": int(score("passkey", res.text[0], case)),
                        "total_s": round(sec["total"], 4),
                        "prefill_s": round(sec.get("prefill", 0.0), 4),
                        "scoring_s": round(sec.get("scoring", 0.0), 4),
                        "decode_s": round(sec.get("decode", 0.0), 4),
                        "step_s": round(sec.get("decode", 0.0) / max(1, res.stats.steps), 5),
                        "nfe": res.stats.nfe,
                        "steps": res.stats.steps,
                        **{f"flops_{k}": v for k, v in flops.items()},
                        "flops_total": flop_model.total(flops),
                    }
                )
            budget.record(method, length, (time.perf_counter() - t0) / len(cases))
            print(f"  {method:>12} @ {length:>6}: {budget.measured[method][1]:.2f} s/case", flush=True)
        if not probe_budget.skip_reason("dense_probe", length, 1, 2.0):
            t = dense_step_probe(model, parts.full().numel() + GEN)
            probe_budget.record("dense_probe", length, t)
            rows.append(
                {
                    "length": length,
                    "method": "dense_step_probe",
                    "status": "ok",
                    "step_s": round(t, 5),
                    "flops_total": flop_model.Arch.of(model.config).forward(
                        parts.full().numel() + GEN, parts.full().numel() + GEN, GEN
                    ),
                }
            )
    write_csv(os.path.join(out_dir, "e2e_speed.csv"), rows, "cpu")
    return rows, startup


def summarize(rows) -> str:
    """Markdown: per length and method mean times, accuracy, measured and FLOP-predicted speedups."""

    def cell(method, length):
        sel = [r for r in rows if r["method"] == method and r["length"] == length and r["status"] == "ok"]
        if not sel:
            return None
        n = len(sel)
        return {
            k: sum(r.get(k, 0) for r in sel) / n
            for k in ("total_s", "prefill_s", "scoring_s", "decode_s", "step_s", "nfe", "flops_total", "correct")
        }

    lines = [
        "| tokens | method | accuracy % | total s | prefill s | scoring s | per-step s | NFE | "
        "speedup vs dense (measured) | speedup (FLOP model) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for length in sorted({r["length"] for r in rows}):
        dense = cell("dense", length)
        for method in METHODS:
            c = cell(method, length)
            if c is None:
                why = next((r["status"] for r in rows if r["method"] == method and r["length"] == length), "-")
                lines.append(f"| {length} | {method} | - | - | - | - | - | - | {why} | - |")
                continue
            d_flops = next((r["flops_total"] for r in rows if r["method"] == "dense" and r["length"] == length), None)
            meas = f"{dense['total_s'] / c['total_s']:.1f}x" if dense else "dense skipped"
            pred = f"{d_flops / c['flops_total']:.1f}x" if d_flops else "-"
            lines.append(
                f"| {length} | {method} | {100 * c['correct']:.0f} | {c['total_s']:.2f} "
                f"| {c['prefill_s']:.2f} | {c['scoring_s']:.2f} | {c['step_s']:.4f} | {c['nfe']:.0f} "
                f"| {meas} | {pred} |"
            )
    probes = [r for r in rows if r["method"] == "dense_step_probe"]
    if probes:
        lines.append("")
        lines.append(
            "Dense per-step probe (one forward): " + ", ".join(f"{r['length']}: {r['step_s']:.3f} s" for r in probes)
        )
    return "\n".join(lines)


def _mean(rows, key, length):
    vals = [r[key] for r in rows if r["length"] == length]
    return sum(vals) / len(vals)


def plot(rows, path: str) -> None:
    """Seconds per generation and per denoising step against the context length, one line per method; a
    point the time budget skipped is a grey x on the axis; the dashed line is one dense forward timed alone
    (the probe: a check that a dense step costs one full forward)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.6))
    colors = dict(zip(METHODS, ("tab:blue", "tab:orange", "tab:green")))
    lengths = sorted({int(r["length"]) for r in rows})
    for method in METHODS + ("dense_step_probe",):
        sel = [r for r in rows if r["method"] == method and r["status"] == "ok"]
        lens = sorted({r["length"] for r in sel})
        if method != "dense_step_probe":
            skipped = sorted({r["length"] for r in rows if r["method"] == method and r["status"] != "ok"})
            i = METHODS.index(method)  # side by side where several methods were skipped at one length
            for ax in (a, b):
                mark_not_run(ax, [dodge(x, i, len(METHODS)) for x in skipped], color=colors[method])
        if not lens:
            continue
        if method != "dense_step_probe":
            a.plot(lens, [_mean(sel, "total_s", ln) for ln in lens], marker="o", color=colors[method], label=method)
            b.plot(lens, [_mean(sel, "step_s", ln) for ln in lens], marker="o", color=colors[method], label=method)
        else:
            b.plot(
                lens, [_mean(sel, "step_s", ln) for ln in lens], marker=".", ls="--", color="tab:red",
                label="dense, one forward timed alone",
            )  # fmt: skip
    for ax, ylabel in (
        (a, "seconds per generation (s, log scale)"),
        (b, "seconds per denoising step (s, log scale)"),
    ):
        token_axis(ax, lengths)
        ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
        ax.plot([], [], ls="none", marker="x", mew=2, color="grey", label="not run (time budget)")
        ax.legend(fontsize=8)
    a.set_title("whole generation (prefill + scoring + decode)")
    b.set_title("one denoising step (decode / steps)")
    save_figure(
        fig,
        path,
        "End-to-end speed: bundled tiny-dream on CPU, passkey, 8 response tokens in 8 steps",
        dpi=120,
        caption="x on the axis: the method was not run at that length (predicted past the time budget). Dashed: one "
        "dense forward over prompt + response timed outside generate, a check that a dense step is one full forward.",
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192, 16384, 32768, 65536])
    p.add_argument("--depths", type=float, nargs="+", default=[0.1, 0.5, 0.9])
    p.add_argument("--budget", type=float, default=420.0, help="seconds of the timed grid")
    args, out = parse_study(p, argv)
    t0 = time.perf_counter()
    rows, startup = run(args.lengths, args.depths, args.budget, str(out))
    ok = [r for r in rows if r["status"] == "ok" and r["method"] in METHODS]
    title = "End-to-end speed vs context length: passkey on the bundled tiny model, three methods side by side"
    paragraphs = [summarize(rows), f"{startup} {first_case_line(first_case_ratios(ok, seconds='total_s'))}"]
    write_report(
        out / "e2e_speed.md", title, "bench.speed.e2e_speed", argv, "cpu", time.perf_counter() - t0, paragraphs
    )
    plot(rows, str(out / "e2e_speed.png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
