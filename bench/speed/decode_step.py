"""The prefilling decode step at the Dream-7B shape: eager, graph and host time, and where the GPU time goes.

    python -m bench.speed.decode_step [--out DIR] [--layers 28] [--repeats 20] [--fused both|on|off] [--dry-run]

A Dream-v0-7B-shaped model (28 layers, hidden 3584, 28 / 4
heads of D = 128, vocabulary 152064, random bf16 weights) decodes one row over a random static
cache of the paper's selection (a 16-token prefix + K = 4 chunks of C = 1024 tokens + anchor), 32
masked response tokens. One denoising step's forward (``PrefillingPolicy.logits``) gets:

* ``eager ms``: synchronise, step, synchronise, median of ``--repeats``;
* ``host ms``: ``--repeats`` eager steps back to back without a sync, wall time / repeats (equal to
  the eager time when the step synchronises inside);
* ``graph ms``: the same step replayed from its CUDA graph (``cuda_graph=True``), median;
* the weight-streaming bound: every bf16 weight read once at the H200's 4.8 TB/s, and the graph
  time over it (the target: at most 1.5x).

``--fused both`` (the default) measures the two paths of the model side by side in one run, on the
same weights, cache and tokens: ``torch`` (``model.fused_ops = False``: the torch elementwise ops) and
``fused`` (``model.fused_ops = True``: the Triton add + RMSNorm, RoPE and SwiGLU kernels of
:mod:`dllm.model.modeling` and its merged q/k/v and gate/up GEMMs, merged once at the start), each
with its three times, their ratio, and the accuracy of the fused step's logits against the torch
step's (max abs difference, share of positions with the same argmax).
``--fused on`` / ``off`` measures one path.

Then ``torch.profiler`` records ``--profile-steps`` graph replays and as many eager steps; the
per-kernel table (GPU time per step, calls per step, share) and the same time grouped by kind
(:func:`kernel_kind`: weight GEMMs, attention, norms, RoPE, SwiGLU, ...) go to
``decode_step.md``, with ``decode_step.csv`` (one row per kernel and mode).

Without CUDA (or with ``--dry-run``) it writes why it skipped and exits 0 (``bench/gpu_check.sh``'s
dry run).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import torch

from bench.kernels import gpu_timing as T
from bench.provenance import machine_line, write_csv

H200_HBM_BYTES_S = 4.8e12
TARGET_OVER_BOUND = 1.5  # the graph step's target: at most 1.5x the weight-streaming bound

# (kind, regex over the kernel name), first match wins; names from cuBLAS / cuBLASLt / CUTLASS,
# torch's native kernels and this package's Triton kernels.
KINDS = [
    ("attention: split-S", r"split_s"),
    ("attention: merge", r"merge_states"),
    ("attention: other", r"flash|fmha|attention|sdpa"),
    ("GEMM (weights, LM head)", r"gemm|cutlass|xmma|nvjet|sm90_|sm80_|cublas|matmul|splitKreduce"),
    ("norm", r"norm|rsqrt"),
    ("RoPE", r"rope|rotary|cos|sin"),
    ("softmax / top-k / sampling", r"softmax|topk|sort|argmax|max_|reduce|radix|scan"),
    ("copy / cat / index", r"copy|cat|gather|scatter|index|fill|memcpy|memset|Memcpy|Memset"),
    ("elementwise (SwiGLU, residual, casts)", r"elementwise|vectorized|unrolled|silu|mul|add|triton_"),
]


def kernel_kind(name: str) -> str:
    """The kind of a GPU kernel from its name (:data:`KINDS`; ``other`` when nothing matches)."""
    for kind, pattern in KINDS:
        if re.search(pattern, name, flags=re.I):
            return kind
    return "other"


def weight_bytes(model) -> int:
    """Bytes of the model's parameters (each read once per step)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def kernel_table(events: list[tuple[str, int, float]], steps: int) -> list[dict]:
    """Per-kernel rows from ``(name, calls, total GPU us)`` over ``steps`` steps, largest first.

    Each row: ``kernel``, ``kind``, ``calls_per_step``, ``us_per_step``, ``share`` (of the summed GPU time).
    """
    if steps < 1:
        raise ValueError(f"kernel_table: steps must be >= 1, got {steps}")
    total = sum(us for _, _, us in events) or 1.0
    rows = [
        dict(
            kernel=name,
            kind=kernel_kind(name),
            calls_per_step=round(calls / steps, 2),
            us_per_step=us / steps,
            share=us / total,
        )
        for name, calls, us in events
        if us > 0
    ]
    return sorted(rows, key=lambda r: -r["us_per_step"])


def by_kind(rows: list[dict]) -> list[dict]:
    """The per-kernel rows summed per kind, largest first."""
    out: dict = {}
    for r in rows:
        k = out.setdefault(r["kind"], dict(kind=r["kind"], kernels=0, calls_per_step=0.0, us_per_step=0.0, share=0.0))
        k["kernels"] += 1
        k["calls_per_step"] += r["calls_per_step"]
        k["us_per_step"] += r["us_per_step"]
        k["share"] += r["share"]
    return sorted(out.values(), key=lambda r: -r["us_per_step"])


def _device_us(evt) -> float:
    """Self GPU time of a profiler average in us (the attribute was renamed from cuda to device)."""
    for attr in ("self_device_time_total", "self_cuda_time_total"):
        v = getattr(evt, attr, None)
        if v is not None:
            return float(v)
    return 0.0


def profile_kernels(step, steps: int) -> list[tuple[str, int, float]]:
    """``(kernel name, calls, GPU us)`` of ``steps`` calls of ``step`` under torch.profiler (CUDA only)."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    out = []
    for evt in prof.key_averages():
        us = _device_us(evt)
        if us > 0 and getattr(evt, "device_type", None) is not None and "CUDA" in str(evt.device_type):
            out.append((evt.key, int(evt.count), us))
    return out


def _markdown(rows: list[dict], cols: list[tuple[str, str]], limit: int | None = None) -> list[str]:
    lines = ["| " + " | ".join(h for h, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows[:limit]:
        cells = []
        for _, key in cols:
            v = r[key]
            if key == "share":
                v = f"{100 * v:.1f}%"
            elif isinstance(v, float):
                v = f"{v:.1f}"
            cells.append(str(v)[:90])
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def report(summary: dict, tables: dict, *, command: str, machine: str) -> str:
    """The markdown of ``decode_step.md`` from the timings (``summary["paths"]``) and the per-mode kernel rows."""
    s = summary
    rows = []
    for path, t in s["paths"].items():
        rows.append(
            f"| {path} | {t['eager_ms']:.3f} | {t['host_ms']:.3f} | {t['graph_ms']:.3f} | {s['bound_ms']:.3f} | "
            f"{t['graph_ms'] / s['bound_ms']:.2f}x | <= {TARGET_OVER_BOUND}x |"
        )
    lines = [
        "# Prefilling decode step at the Dream-7B shape: eager, graph, host, and its kernels",
        "",
        f"Command: `{command}`  ",
        f"{machine}.",
        "",
        f"Shape: {s['layers']} layers, random bf16 weights ({s['weight_gb']:.2f} GB), one row, cache of a 16-token "
        f"prefix + 4 x 1025 tokens, {s['gen']} masked response tokens.",
        "",
        "| path | eager ms | host ms | graph ms | weight-streaming bound ms | graph / bound | target |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        f"Bound: the weights once at {H200_HBM_BYTES_S / 1e12:.1f} TB/s (the KV cache adds "
        f"{s['kv_gb']:.2f} GB). Host: {s['repeats']} eager steps back to back without a sync, per step. "
        "Paths: `torch` = the model's torch elementwise ops, `fused` = its Triton add + RMSNorm, RoPE and SwiGLU "
        "and one GEMM for q/k/v and one for gate/up.",
    ]
    if {"torch", "fused"} <= set(s["paths"]):
        t, f = s["paths"]["torch"], s["paths"]["fused"]
        acc = s.get("accuracy", {})
        lines += [
            "",
            f"Fused over torch, same run: eager {t['eager_ms'] / f['eager_ms']:.2f}x, host "
            f"{t['host_ms'] / f['host_ms']:.2f}x, graph {t['graph_ms'] / f['graph_ms']:.2f}x faster. Accuracy "
            f"(graph logits, fused vs torch): max abs difference {acc.get('max_abs_diff', float('nan')):.3g} "
            f"(largest |logit| {acc.get('max_abs_logit', float('nan')):.3g}), same argmax at "
            f"{100 * acc.get('argmax_agree', float('nan')):.1f}% of the positions.",
        ]
    for mode, rows in tables.items():
        if not rows:
            lines += ["", f"## {mode}: no kernels recorded by the profiler"]
            continue
        total = sum(r["us_per_step"] for r in rows)
        lines += ["", f"## {mode}: {total / 1e3:.3f} ms of kernel time per step, by kind", ""]
        kind_cols = [("kind", "kind"), ("kernels", "kernels"), ("calls / step", "calls_per_step")]
        kind_cols += [("us / step", "us_per_step"), ("share", "share")]
        lines += _markdown(by_kind(rows), kind_cols)
        lines += ["", f"## {mode}: the 25 largest kernels", ""]
        cols = [("kernel", "kernel"), ("kind", "kind"), ("calls / step", "calls_per_step")]
        cols += [("us / step", "us_per_step"), ("share", "share")]
        lines += _markdown(rows, cols, 25)
    return "\n".join(lines) + "\n"


def _median_ms(fn, repeats: int) -> float:
    return T.eager_us(fn, repeats, sync=T.cuda_sync) / 1e3


PATHS = {"on": ("fused",), "off": ("torch",), "both": ("torch", "fused")}  # --fused choice -> model paths run


def run(layers: int, repeats: int, profile_steps: int, gen: int = 32, paths: tuple = ("torch", "fused"), on_path=None):
    """Build the model and cache on the GPU; per model path (``torch``, ``fused``) time the step eagerly,
    on the host and from its CUDA graph, and profile it both ways. Returns ``(summary, tables)``:
    ``summary["paths"][path]`` holds ``eager_ms``, ``host_ms``, ``graph_ms``; with both paths
    ``summary["accuracy"]`` compares their graph logits; ``tables["<path>: graph replay" | "<path>: eager"]``.
    ``on_path(summary, tables)``, if given, runs after each path (``main`` writes its files there, so a run
    cut short by its stage timeout keeps the paths it finished)."""
    from bench.kernels.cuda_graph_check import _random_cache, dream_model
    from dllm.decode.policies import PrefillingPolicy

    model = dream_model(layers)
    model.merge_projections()  # the fused path's layout, made once before anything is captured (same bytes)
    dev = model.device
    cache = _random_cache(model, 1, seed=1, chunk=1024)
    vocab = min(model.config.vocab_size, model.mask_token_id)
    query = torch.randint(0, vocab, (1, 40), generator=torch.Generator(device=dev).manual_seed(1), device=dev)
    start = 16 + 4 * 1025
    resp = torch.full((1, gen), model.mask_token_id, dtype=torch.long, device=dev)
    cfg = model.config
    kv_bytes = 2 * cfg.num_layers * (start + 40 + gen) * cfg.num_kv_heads * cfg.head_dim * 2
    summary = dict(layers=layers, gen=gen, repeats=repeats, weight_gb=weight_bytes(model) / 1e9, kv_gb=kv_bytes / 1e9)
    summary["bound_ms"] = 1e3 * weight_bytes(model) / H200_HBM_BYTES_S
    summary["paths"] = {}
    tables = {}
    logits = {}
    with torch.no_grad():
        for path in paths:
            model.fused_ops = path == "fused"  # eager steps read it at every call; a graph at its capture
            eager = PrefillingPolicy(model, query, start, cache, gen, 0, cuda_graph=False)
            eager.logits(resp)  # warm-up (compiles the Triton kernels of this path)
            t = dict(eager_ms=_median_ms(lambda p=eager: p.logits(resp), repeats))
            t["host_ms"] = T.host_time_us(lambda p=eager: p.logits(resp), repeats, sync=T.cuda_sync) / 1e3
            graph = PrefillingPolicy(model, query, start, cache, gen, 0, cuda_graph=True)
            logits[path] = graph.logits(resp).float().clone()  # warm-up + capture
            t["graph_ms"] = _median_ms(lambda p=graph: p.logits(resp), repeats)
            summary["paths"][path] = t
            for mode, pol in (("graph replay", graph), ("eager", eager)):
                name = f"{path}: {mode}"
                try:
                    steps = profile_kernels(lambda p=pol: p.logits(resp), profile_steps)
                    tables[name] = kernel_table(steps, profile_steps)
                except Exception as exc:  # the timings above stand without the breakdown
                    print(f"[decode_step] profiler failed in {name}: {type(exc).__name__}: {exc}", flush=True)
                    tables[name] = []
            if len(logits) == 2:
                a, b = logits["torch"], logits["fused"]
                summary["accuracy"] = dict(
                    max_abs_diff=float((a - b).abs().max()),
                    max_abs_logit=float(a.abs().max()),
                    argmax_agree=float((a.argmax(-1) == b.argmax(-1)).float().mean()),
                )
            if on_path is not None:
                on_path(summary, tables)
        model.fused_ops = None
    return summary, tables


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/bench", help="output folder (default: runs/bench, git-ignored)")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument(
        "--fused",
        choices=sorted(PATHS),
        default="both",
        help="model path(s) to measure: the fused Triton elementwise kernels (on), the torch ops (off), or "
        "both side by side (default)",
    )
    ap.add_argument("--dry-run", action="store_true", help="skip (gpu_check.sh's dry run): say so and exit 0")
    args = ap.parse_args(argv)
    if args.layers < 1 or args.repeats < 1 or args.profile_steps < 1:
        print("error: --layers, --repeats and --profile-steps must be >= 1", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cmd = " ".join(["python -m bench.speed.decode_step", *(sys.argv[1:] if argv is None else argv)])
    why = "dry run (--dry-run)" if args.dry_run else None if torch.cuda.is_available() else "no CUDA device here"
    if why is not None:
        (out / "decode_step.md").write_text(
            f"# Decode step at the Dream-7B shape\n\nCommand: `{cmd}`\n\nSkipped: {why}.\n"
        )
        print(f"decode_step skipped: {why}")
        return 0
    t0 = time.perf_counter()

    def write(summary, tables):
        rows = [dict(mode=mode, **r) for mode, rs in tables.items() for r in rs]
        common = {k: v for k, v in summary.items() if k not in ("paths", "accuracy")}
        rows += [dict(mode=f"summary: {path}", **common, **t) for path, t in summary["paths"].items()]
        if "accuracy" in summary:
            rows.append(dict(mode="accuracy: fused vs torch", **summary["accuracy"]))
        write_csv(out / "decode_step.csv", rows, "cuda")
        machine = f"{machine_line('cuda')}; {time.perf_counter() - t0:.0f} s"
        (out / "decode_step.md").write_text(report(summary, tables, command=cmd, machine=machine))
        print(f"[decode_step] {', '.join(summary['paths'])} written ({time.perf_counter() - t0:.0f} s)", flush=True)

    run(args.layers, args.repeats, args.profile_steps, paths=PATHS[args.fused], on_path=write)
    print((out / "decode_step.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
