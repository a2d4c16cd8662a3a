"""Kernel microbenchmarks: split_s_attention, chunk_attention_scores, topb_gather vs torch baselines.

    python -m bench.bench_kernels --out DIR [--device cuda|cpu] [--budget-s 240] [--full]

On a GPU (bf16, Dream-7B heads 28/4 and LLaDA-8B heads 32/32, D = 128):

* ``split_s_attention`` (Triton) against
  - ``flex_compiled``: vanilla ``torch.compile(flex_attention)`` with a cached
    ``BlockMask`` over the same keys laid out as a padded pool (the K slots
    flattened, the live block appended; built once, outside the timing);
  - ``sdpa_pregathered``: ``scaled_dot_product_attention`` (``enable_gqa``) over a
    contiguous copy of the selected keys + live keys (gather time excluded);
  - ``sdpa_gather_included``: the same with the gather (advanced indexing + ``cat``) timed.
* ``chunk_attention_scores`` (Triton) against a vectorised torch version that
  materialises the ``[N, Hq, M, T + E]`` probabilities.
* ``topb_gather`` (Triton gather) against torch selection + ``torch.gather``.

Timing: ``triton.testing.do_bench`` (median, 20th/80th percentiles). Every
method's output is checked against the fp32 torch reference *before* it is
timed (tolerance: 2 x the error of plain torch attention in the same dtype +
a floor); a method whose check fails is still timed but gets no speedup.
Reported: latency, achieved GB/s (bytes of Q, valid K/V read + outputs
written, i.e. useful bytes) and TFLOP/s (4 * M * Hq * keys * D for attention).

On CPU (no Triton compile; the interpreter is not a performance path) the same
comparison runs between the torch paths at small fp32 shapes: the reference
(``triton_kernels.reference``, what CPU tensors dispatch to), compiled
FlexAttention on CPU, and SDPA; rows are labelled ``CPU``.

Writes ``DIR/bench_kernels_{gpu,cpu}.csv`` (provenance columns on every row)
and prints a summary table with ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.provenance import provenance, write_csv
from triton_kernels import reference as R

MODELS = {"dream7b": (28, 4), "llada8b": (32, 32)}  # (Hq, Hkv)
FLOORS = {torch.float32: 1e-4, torch.float16: 1e-3, torch.bfloat16: 4e-3}


# ----------------------------------------------------------------------------- timing


def time_fn(fn, device: torch.device, rep_ms: int = 100) -> dict:
    """Median and 20/80 % quantiles in ms."""
    if device.type == "cuda":
        import triton.testing

        med, lo, hi = triton.testing.do_bench(fn, warmup=25, rep=rep_ms, quantiles=[0.5, 0.2, 0.8])
        return {"median_ms": med, "p20_ms": lo, "p80_ms": hi}
    fn()  # warm-up (compile caches, allocator)
    times = []
    t_end = time.perf_counter() + 1.0
    while len(times) < 3 or (time.perf_counter() < t_end and len(times) < 50):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    qs = statistics.quantiles(times, n=5) if len(times) >= 5 else [min(times)] * 4
    return {"median_ms": statistics.median(times), "p20_ms": qs[0], "p80_ms": qs[-1]}


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    if torch.isnan(a).any() or torch.isnan(b).any():
        return float("inf")
    return float((a - b).abs().max()) if a.numel() else 0.0


def lowp_attention(q, k, v, scale, dtype):
    """Plain torch attention computed in ``dtype`` (the error budget). q [M,Hq,D], k/v [L,Hkv,D]."""
    g = q.shape[1] // k.shape[1]
    s = torch.einsum("mhd,lhd->hml", q.to(dtype), k.to(dtype).repeat_interleave(g, 1)) * scale
    p = torch.softmax(s.float(), -1).to(dtype)
    return torch.einsum("hml,lhd->mhd", p, v.to(dtype).repeat_interleave(g, 1)).float()


@contextlib.contextmanager
def _env(key: str, value: str):
    old = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


@dataclass
class Method:
    name: str
    fn: object  # () -> output tensor (or tuple whose [0] is compared)
    compare: bool = True
    check: str | None = None  # a verdict decided by the caller (exact comparisons)


def run_methods(case: dict, methods: list[Method], ref, budget_err: float, dtype, device, anchor: str) -> list[dict]:
    """Check then time every method; speedups relative to ``anchor`` (only between passing checks)."""
    rows = []
    floor = FLOORS[dtype]
    for m in methods:
        row = dict(case, method=m.name)
        try:
            out = m.fn()
            out = out[0] if isinstance(out, (tuple, list)) else out
            if m.check is not None:
                row.update(check=m.check)
            elif m.compare and ref is not None:
                err = max_err(out, ref)
                tol = 2 * budget_err + floor
                row.update(max_err=f"{err:.3e}", tol=f"{tol:.3e}", check="ok" if err <= tol else "FAIL")
            else:
                row.update(check="exact" if ref is None else "n/a")
            # Timed without the per-call value checks (one host sync each): they ran just above.
            with _env("PREFILLING_DLLM_CHECK_VALUES", "0"):
                row.update(time_fn(m.fn, device))
        except Exception as exc:  # a baseline that cannot run here is reported, not fatal
            row.update(check="ERROR", note=f"{type(exc).__name__}: {str(exc)[:160]}")
        rows.append(row)
    good = ("ok", "exact", "n/a")
    base = next((r for r in rows if r["method"] == anchor and r.get("check") in good), None)
    base_ms = base["median_ms"] if base is not None else None
    for r in rows:
        t = r.get("median_ms")
        if t:
            r["gbps"] = f"{case['bytes'] / (t * 1e-3) / 1e9:.1f}"
            r["tflops"] = f"{case['flops'] / (t * 1e-3) / 1e12:.3f}"
        if base_ms and t and r.get("check") in good:
            r[f"time_over_{anchor}"] = f"{t / base_ms:.2f}"  # > 1: the anchor is faster
    for r in rows:
        for k in ("median_ms", "p20_ms", "p80_ms"):
            if k in r:
                r[k] = f"{r[k]:.4f}"
    return rows


# ----------------------------------------------------------------------------- split-S


def bench_split_s(model, k_segs, seg_len, m, dtype, device, flex_cache) -> list[dict]:
    import triton_kernels as tk

    hq, hkv = MODELS[model]
    d = 128
    gen = torch.Generator().manual_seed(k_segs * 1000 + seg_len + m)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    q = rnd(1, m, hq, d)
    k_pool, v_pool = rnd(k_segs, seg_len, hkv, d), rnd(k_segs, seg_len, hkv, d)
    k_live, v_live = rnd(1, m, hkv, d), rnd(1, m, hkv, d)
    slots = torch.randperm(k_segs, generator=gen).to(device=device, dtype=torch.int32)[None]  # any slot order
    lens = torch.full((1, k_segs), seg_len, dtype=torch.int32, device=device)
    scale = 1 / math.sqrt(d)
    n_keys = k_segs * seg_len + m
    elt = q.element_size()
    case = dict(
        op="split_s_attention", model=model, dtype=str(dtype).replace("torch.", ""), B=1, M=m, Hq=hq, Hkv=hkv,
        D=d, K=k_segs, L=seg_len, keys=n_keys,
        bytes=(2 * m * hq * d + 2 * n_keys * hkv * d) * elt + m * hq * 4,
        flops=4 * m * hq * n_keys * d,
    )  # fmt: skip

    # References: fp32 torch reference, and the error budget of plain torch in this dtype.
    args32 = [x.float() for x in (q, k_pool, v_pool)] + [slots, lens, k_live.float(), v_live.float()]
    ref, _ = R.split_s_attention(*args32, sm_scale=scale)
    sel = slots[0].long()
    k_cat = torch.cat([k_pool[sel].flatten(0, 1), k_live[0]])  # [keys, Hkv, D]
    v_cat = torch.cat([v_pool[sel].flatten(0, 1), v_live[0]])
    budget = max_err(lowp_attention(q[0], k_cat, v_cat, scale, dtype)[None], ref)
    del args32

    methods = []
    if device.type == "cuda":
        methods.append(
            Method(
                "split_s_triton",
                lambda: tk.split_s_attention(q, k_pool, v_pool, slots, lens, k_live, v_live, backend="triton"),
            )
        )
    else:
        methods.append(
            Method("torch_reference", lambda: R.split_s_attention(q, k_pool, v_pool, slots, lens, k_live, v_live))
        )

    # FlexAttention over the padded pool: [slot 0 | slot 1 | ... | live], mask by per-slot length.
    # A fresh compile per shape (after a dynamo reset) so the recompile limit never drops it to eager.
    flex = None
    if flex_cache.get("fn") is not None:
        torch._dynamo.reset()
        flex = torch.compile(flex_cache["fn"], dynamic=False)
    if flex is not None:
        from torch.nn.attention.flex_attention import create_block_mask

        p_slots, t = k_segs, seg_len
        slot_len = torch.zeros(p_slots, dtype=torch.int32, device=device)
        slot_len[slots[0].long()] = lens[0]
        kf = torch.cat([k_pool.flatten(0, 1), k_live[0]]).transpose(0, 1)[None]  # [1, Hkv, P*T + M, D]
        vf = torch.cat([v_pool.flatten(0, 1), v_live[0]]).transpose(0, 1)[None]
        qf = q.transpose(1, 2)  # [1, Hq, M, D]

        def mask_mod(b, h, q_idx, kv_idx):
            slot = torch.clamp(kv_idx // t, max=p_slots - 1)
            return torch.where(kv_idx < p_slots * t, (kv_idx % t) < slot_len[slot], True)

        block_mask = create_block_mask(mask_mod, 1, None, m, p_slots * t + m, device=str(device))  # cached
        methods.append(
            Method(
                "flex_compiled",
                lambda: flex(qf, kf, vf, block_mask=block_mask, scale=scale, enable_gqa=True).transpose(1, 2),
            )
        )

    kc, vc = k_cat.transpose(0, 1)[None], v_cat.transpose(0, 1)[None]  # [1, Hkv, keys, D] (views)
    qt = q.transpose(1, 2)

    def sdpa_pre():
        return F.scaled_dot_product_attention(qt, kc, vc, scale=scale, enable_gqa=True).transpose(1, 2)

    def sdpa_gather():
        kg = torch.cat([k_pool[sel].flatten(0, 1), k_live[0]]).transpose(0, 1)[None]
        vg = torch.cat([v_pool[sel].flatten(0, 1), v_live[0]]).transpose(0, 1)[None]
        return F.scaled_dot_product_attention(qt, kg, vg, scale=scale, enable_gqa=True).transpose(1, 2)

    methods += [Method("sdpa_pregathered", sdpa_pre), Method("sdpa_gather_included", sdpa_gather)]
    anchor = "split_s_triton" if device.type == "cuda" else "torch_reference"
    return run_methods(case, methods, ref, budget, dtype, device, anchor)


# ----------------------------------------------------------------------------- chunk scores


def torch_chunk_scores(q, k, k_extra, scale):
    """Vectorised torch: materialises [N, Hq, M, T + E] probabilities (all chunk keys valid)."""
    n, m, hq, d = q.shape
    hkv = k.shape[2]
    g = hq // hkv
    keys = torch.cat([k, k_extra], 1).repeat_interleave(g, 2)  # [N, L, Hq, D]
    s = torch.einsum("nmhd,nlhd->nhml", q, keys).float() * scale
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None])
    per_kv = p.sum(2).view(n, hkv, g, -1).sum(2)  # [N, Hkv, L]
    t = k.shape[1]
    return per_kv[..., :t], per_kv[..., t:], lse.transpose(1, 2)


def bench_chunk_scores(model, n, t, m, dtype, device) -> list[dict]:
    import triton_kernels as tk

    hq, hkv = MODELS[model]
    d = 128
    gen = torch.Generator().manual_seed(n + t + m)
    q = torch.randn(n, m, hq, d, generator=gen).to(device=device, dtype=dtype)
    k = torch.randn(n, t, hkv, d, generator=gen).to(device=device, dtype=dtype)
    x = torch.randn(n, m, hkv, d, generator=gen).to(device=device, dtype=dtype)
    scale = 1 / math.sqrt(d)
    elt = q.element_size()
    case = dict(
        op="chunk_attention_scores", model=model, dtype=str(dtype).replace("torch.", ""), B=n, M=m, Hq=hq,
        Hkv=hkv, D=d, K=n, L=t, keys=t + m,
        bytes=(n * m * hq * d + n * (t + m) * hkv * d) * elt + 4 * (n * hkv * (t + m) + n * m * hq),
        flops=2 * n * m * hq * (t + m) * d,  # one Q K^T (the kernel computes it twice)
    )  # fmt: skip
    ref = R.chunk_attention_scores(q.float(), k.float(), None, x.float(), sm_scale=scale)[0]
    low = torch_chunk_scores(q, k, x, scale)[0]
    budget = max_err(low, ref)
    methods = []
    if device.type == "cuda":
        methods.append(
            Method("chunk_scores_triton", lambda: tk.chunk_attention_scores(q, k, None, x, backend="triton"))
        )
    else:
        methods.append(Method("torch_reference", lambda: R.chunk_attention_scores(q, k, None, x)))
    methods.append(Method("torch_vectorised", lambda: torch_chunk_scores(q, k, x, scale)))
    anchor = "chunk_scores_triton" if device.type == "cuda" else "torch_reference"
    return run_methods(case, methods, ref, budget, dtype, device, anchor)


# ----------------------------------------------------------------------------- top-b gather


def torch_topb(scores, k, v, b):
    from triton_kernels.topb import select_topb

    idx, kept = select_topb(scores, b, None, 7, True)  # [N, H, b]
    gi = idx.clamp(min=0).transpose(1, 2)[..., None].expand(-1, -1, -1, k.shape[-1])  # [N, b, H, D]
    return torch.gather(k, 1, gi), torch.gather(v, 1, gi), idx, kept


def bench_topb(model, n, t, b, dtype, device) -> list[dict]:
    import triton_kernels as tk

    _, hkv = MODELS[model]
    d = 128
    gen = torch.Generator().manual_seed(n + t + b)
    scores = torch.rand(n, hkv, t, generator=gen).to(device)
    k = torch.randn(n, t, hkv, d, generator=gen).to(device=device, dtype=dtype)
    v = torch.randn(n, t, hkv, d, generator=gen).to(device=device, dtype=dtype)
    elt = k.element_size()
    case = dict(
        op="topb_gather", model=model, dtype=str(dtype).replace("torch.", ""), B=n, M=b, Hq="", Hkv=hkv, D=d,
        K=n, L=t, keys=b, bytes=4 * n * b * hkv * d * elt + n * hkv * t * 4, flops=0,
    )  # fmt: skip
    ref = R.topb_gather(scores, k, v, b)
    methods = []
    if device.type == "cuda":
        methods.append(Method("topb_triton", lambda: tk.topb_gather(scores, k, v, b, backend="triton"), compare=False))
    else:
        methods.append(Method("torch_reference", lambda: R.topb_gather(scores, k, v, b), compare=False))
    methods.append(Method("torch_gather", lambda: torch_topb(scores, k, v, b), compare=False))
    for m in methods:  # exact check: same indices, same gathered rows
        got = m.fn()
        m.check = "exact" if all(torch.equal(a, r) for a, r in zip(got, ref, strict=True)) else "FAIL"
    anchor = "topb_triton" if device.type == "cuda" else "torch_reference"
    return run_methods(case, methods, None, 0.0, dtype, device, anchor)


# ----------------------------------------------------------------------------- driver


def plan(device: torch.device, full: bool):
    """(kind, args) in priority order: the budget cuts from the end."""
    if device.type == "cuda":
        dt = torch.bfloat16
        split = [
            ("dream7b", 16, 1024, 32), ("dream7b", 64, 1024, 32), ("dream7b", 4, 1024, 32),
            ("dream7b", 16, 1024, 288), ("dream7b", 64, 256, 64), ("llada8b", 16, 1024, 32),
            ("llada8b", 64, 1024, 288), ("dream7b", 4, 256, 64), ("llada8b", 4, 1024, 64),
        ]  # fmt: skip
        if full:
            split += [
                (mdl, k, ln, m)
                for mdl in MODELS
                for k in (4, 16, 64)
                for ln in (256, 1024)
                for m in (32, 64, 288)
                if (mdl, k, ln, m) not in split
            ]
        jobs = [("split_s", (*s, dt)) for s in split[:3]]
        jobs += [("chunk_scores", ("dream7b", 16, 1024, 64, dt)), ("topb", ("dream7b", 64, 1024, 256, dt))]
        jobs += [("split_s", (*s, dt)) for s in split[3:]]
        jobs += [("chunk_scores", ("llada8b", 16, 1024, 64, dt)), ("topb", ("llada8b", 64, 1024, 256, dt))]
        return jobs
    dt = torch.float32
    split = [
        ("dream7b", 4, 256, 32),
        ("dream7b", 16, 256, 32),
        ("dream7b", 64, 256, 32),
        ("dream7b", 4, 256, 64),
        ("dream7b", 4, 256, 288),
        ("llada8b", 4, 256, 32),
    ]
    jobs = [("split_s", (*s, dt)) for s in split]
    jobs += [("chunk_scores", ("dream7b", 4, 256, 32, dt)), ("topb", ("dream7b", 16, 1024, 256, dt))]
    return jobs


def summarise(rows: list[dict], device: torch.device) -> str:
    label = "GPU" if device.type == "cuda" else "CPU"
    cols = ["op", "model", "K", "L", "M", "method", "median_ms", "gbps", "tflops", "check"]
    ratio_cols = sorted({k for r in rows for k in r if k.startswith("time_over_")})
    cols += ratio_cols
    widths = {c: max([len(c)] + [len(str(r.get(c, ""))) for r in rows]) for c in cols}
    lines = [f"[{label}] " + " ".join(c.ljust(widths[c]) for c in cols)]
    for r in rows:
        lines.append(f"[{label}] " + " ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols))
    lines.append(f"[{label}] time_over_X = time of this method / time of X (> 1: X is faster); blank = check failed")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Prefilling-dLLM kernel microbenchmarks")
    ap.add_argument("--out", required=True, help="output directory for the CSV")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop starting new cases after this many s")
    ap.add_argument("--full", action="store_true", help="GPU: the whole K x L x M grid (long)")
    ap.add_argument("--no-flex", action="store_true", help="skip the FlexAttention baseline (no compile)")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU: torch threads (default 1: on small shared CI boxes an OpenMP team can cost ms per op)",
    )
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_kernels: --device cuda but no CUDA device", file=sys.stderr)
        return 2
    if device.type == "cpu":
        torch.set_num_threads(max(1, args.threads))
    prov = provenance(str(device))
    print(f"[bench_kernels] {prov['device_kind']}: {prov['device_name']} | torch {prov['torch']} "
          f"triton {prov['triton']} | commit {prov['commit']}", flush=True)  # fmt: skip

    flex_cache: dict = {}
    if not args.no_flex:
        try:
            from torch.nn.attention.flex_attention import flex_attention

            flex_cache["fn"] = flex_attention  # compiled per case in bench_split_s
        except Exception as exc:  # pragma: no cover - older torch
            print(f"[bench_kernels] FlexAttention unavailable: {exc}", flush=True)

    out = Path(args.out) / f"bench_kernels_{'gpu' if device.type == 'cuda' else 'cpu'}.csv"
    rows: list[dict] = []
    t_start = time.time()
    for kind, a in plan(device, args.full):
        if rows and time.time() - t_start > args.budget_s:  # the first case always runs
            print(f"[bench_kernels] budget {args.budget_s:.0f}s reached: skipping {kind}{a[:-1]}", flush=True)
            rows.append(dict(op=kind, model=a[0], check="SKIPPED", note=f"time budget; args={a[:-1]}"))
            continue
        t0 = time.time()
        if kind == "split_s":
            new = bench_split_s(*a, device, flex_cache)
        elif kind == "chunk_scores":
            new = bench_chunk_scores(*a, device)
        else:
            new = bench_topb(*a, device)
        for r in new:
            r["device_label"] = "GPU" if device.type == "cuda" else "CPU"
        rows += new
        print(f"[bench_kernels] {kind}{a[:-1]} done in {time.time() - t0:.1f}s", flush=True)
        write_csv(out, rows, str(device))  # rewritten after every case: a killed run keeps its rows
        if device.type == "cuda":
            torch.cuda.empty_cache()

    write_csv(out, rows, str(device))
    print(summarise([r for r in rows if r.get("check") != "SKIPPED"], device))
    print(f"[bench_kernels] wrote {out} ({len(rows)} rows) in {time.time() - t_start:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
