"""Kernel microbenchmarks: every op of ``triton_kernels`` against the strongest torch baselines we know.

    python -m bench.bench_kernels --out DIR [--device cuda|cpu] [--budget-s 240] [--no-flex]

Cases come from the registry ``bench/kernel_cases.py`` (``gpu`` cases in bf16 on a GPU,
``cpu`` cases in fp32 elsewhere), in priority order: the time budget cuts from the end.
Per op, side by side in one run, after a warm-up:

* ``split_s_attention``: ours (Triton on a GPU; on CPU what CPU tensors dispatch to, torch's
  fused CPU attention one row at a time, with the naive torch reference beside it) against
  - ``flex_compiled``: vanilla ``torch.compile(flex_attention)`` over the segments laid out
    as a padded pool plus the live block, with a cached ``BlockMask`` (built untimed);
  - ``flex_gqa_pad8`` (GPU, when G is not a power of two, e.g. Dream's 7): the same with each
    KV head's query group zero-padded to 8 heads, so FlexAttention can take its decoding
    kernel (power-of-two groups only); the pad and the un-pad are timed;
  - ``sdpa_pregathered``: ``scaled_dot_product_attention`` (``enable_gqa``) over a
    contiguous copy of the selected keys + live keys (gather untimed);
  - ``sdpa_gather_included``: the same with the gather (indexing + ``cat``) timed.
* ``merge_states``: ours against the torch reference and a plain ``torch.logsumexp`` merge.
* ``chunk_attention_scores`` / ``chunk_row_mass``: ours against vectorised torch that
  materialises the probabilities.
* ``topb_gather``: ours against torch selection + ``torch.gather``.

Every method's output is checked before it is timed, with the rule of
:mod:`triton_kernels.testing` (error <= 2 x plain torch's error in the same dtype + a
floor; top-B: exact). A method that fails its check is timed but ranks nowhere. Each row
reports the median latency (``triton.testing.do_bench`` on a GPU), achieved GB/s and
TFLOP/s of the op's minimal work (``bench/roofline.py``), on a GPU the percentage of the
H200 lower bound, and ``speedup_vs_best``: the fastest passing baseline's time over ours
(> 1: we are faster), naming that baseline.

Writes ``DIR/bench_kernels_{gpu,cpu}.csv`` (provenance columns on every row) and prints a
summary table.
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

from bench import roofline
from bench.kernel_cases import HEAD_DIM, Case, cases, make_inputs
from bench.provenance import provenance, write_csv
from triton_kernels import reference as R
from triton_kernels.testing import check_rule, lowp_attention

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
    ours: bool = False
    check: str | None = None  # a verdict decided by the caller (exact comparisons)


@dataclass
class Bench:
    """What one case needs: the methods, the fp32 reference and plain torch's low-precision output."""

    methods: list
    ref: torch.Tensor | None  # None: every method carries its own (exact) verdict
    lowp: torch.Tensor | None


def run_case(case: Case, bench: Bench, dtype, device) -> list[dict]:
    """Check then time every method; rank the baselines; speedup of ours over the fastest."""
    c = roofline.cost(case, torch.tensor([], dtype=dtype).element_size())
    bound_us, limiter = roofline.bound_us(c)
    base = dict(
        op=case.op, case=case.name, model=case.model, dtype=str(dtype).replace("torch.", ""),
        bytes=int(c.bytes), mma_flops=int(c.mma_flops), exps=int(c.exps),
        h200_bound_us=f"{bound_us:.2f}", h200_limit=limiter,
    )  # fmt: skip
    rows = []
    for m in bench.methods:
        row = dict(base, method=m.name, ours=int(m.ours))
        try:
            out = m.fn()
            out = out[0] if isinstance(out, (tuple, list)) else out
            if m.check is not None:
                row.update(check=m.check)
            else:
                ok, err, tol = check_rule(out, bench.ref, bench.lowp, dtype)
                row.update(max_err=f"{err:.3e}", tol=f"{tol:.3e}", check="ok" if ok else "FAIL")
            # Timed without the per-call value checks (one host sync each): they ran just above.
            with _env("PREFILLING_DLLM_CHECK_VALUES", "0"):
                row.update(time_fn(m.fn, device))
        except Exception as exc:  # a baseline that cannot run here is reported, not fatal
            row.update(check="ERROR", note=f"{type(exc).__name__}: {str(exc)[:160]}")
        rows.append(row)
    good = ("ok", "exact")
    ours = next((r for r in rows if r["ours"] and r.get("check") in good and "median_ms" in r), None)
    rivals = [r for r in rows if not r["ours"] and r.get("check") in good and "median_ms" in r]
    best = min(rivals, key=lambda r: r["median_ms"], default=None)
    for r in rows:
        t = r.get("median_ms")
        if not t:
            continue
        r["gbps"] = f"{c.bytes / (t * 1e-3) / 1e9:.1f}"
        r["tflops"] = f"{(c.mma_flops + c.simt_flops) / (t * 1e-3) / 1e12:.3f}"
        if device.type == "cuda":
            r["pct_of_h200_bound"] = f"{100 * bound_us / (t * 1e3):.1f}"
        if ours is not None and not r["ours"]:
            r["time_over_ours"] = f"{t / ours['median_ms']:.2f}"
    if ours is not None and best is not None:
        ours["speedup_vs_best"] = f"{best['median_ms'] / ours['median_ms']:.2f}"
        ours["best_baseline"] = best["method"]
    for r in rows:
        for k in ("median_ms", "p20_ms", "p80_ms"):
            if k in r:
                r[k] = f"{r[k]:.4f}"
    return rows


# ----------------------------------------------------------------------------- split-S


def _flex(flex_cache):
    """A fresh ``torch.compile(flex_attention)`` per case (the recompile limit never drops it to eager)."""
    if flex_cache.get("fn") is None:
        return None
    torch._dynamo.reset()
    return torch.compile(flex_cache["fn"], dynamic=False)


def split_s_bench(case: Case, dtype, device, flex_cache) -> Bench:
    import triton_kernels as tk

    a = make_inputs(case, device, dtype)
    q, k_pool, v_pool, slots, lens, k_live, v_live = (
        a[x] for x in ("q", "k_pool", "v_pool", "seg_slots", "seg_lens", "k_live", "v_live")
    )
    hq, hkv = case.heads
    g = hq // hkv
    m = q.shape[1]
    scale = 1 / math.sqrt(HEAD_DIM)
    args32 = [x.float() for x in (q, k_pool, v_pool)] + [slots, lens, k_live.float(), v_live.float()]
    ref, _ = R.split_s_attention(*args32, sm_scale=scale)
    sel = slots[0].long()
    k_cat = torch.cat([k_pool[sel].flatten(0, 1), k_live[0]])  # [keys, Hkv, D]
    v_cat = torch.cat([v_pool[sel].flatten(0, 1), v_live[0]])
    lowp = lowp_attention(q[0], k_cat, v_cat, scale, dtype)[0][None]
    del args32

    if device.type == "cuda":
        ours = Method(
            "split_s_triton",
            lambda: tk.split_s_attention(q, k_pool, v_pool, slots, lens, k_live, v_live, backend="triton"),
            ours=True,
        )
    else:
        # what CPU tensors dispatch to: torch's fused CPU attention, one call per row shape
        ours = Method(
            "split_s_cpu",
            lambda: tk.split_s_attention(q, k_pool, v_pool, slots, lens, k_live, v_live, backend="torch"),
            ours=True,
        )
    methods = [ours]
    if device.type != "cuda":  # the naive reference beside it
        methods.append(
            Method("torch_reference", lambda: R.split_s_attention(q, k_pool, v_pool, slots, lens, k_live, v_live))
        )

    flex = _flex(flex_cache)
    if flex is not None:
        from torch.nn.attention.flex_attention import create_block_mask

        p_slots, t = k_pool.shape[0], k_pool.shape[1]
        slot_len = torch.zeros(p_slots, dtype=torch.int32, device=device)
        slot_len[sel] = lens[0]
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
        g8 = 1 << (g - 1).bit_length()
        if device.type == "cuda" and g8 != g:

            def flex_pad():
                qp = q.new_zeros(1, m, hkv, g8, HEAD_DIM)
                qp[:, :, :, :g] = q.view(1, m, hkv, g, HEAD_DIM)
                o = flex(qp.view(1, m, hkv * g8, HEAD_DIM).transpose(1, 2), kf, vf, block_mask=block_mask,
                         scale=scale, enable_gqa=True)  # fmt: skip
                return o.transpose(1, 2).reshape(1, m, hkv, g8, HEAD_DIM)[:, :, :, :g].reshape(1, m, hq, HEAD_DIM)

            methods.append(Method("flex_gqa_pad8", flex_pad))

    kc, vc = k_cat.transpose(0, 1)[None], v_cat.transpose(0, 1)[None]  # [1, Hkv, keys, D] (views)
    qt = q.transpose(1, 2)

    def sdpa_pre():
        return F.scaled_dot_product_attention(qt, kc, vc, scale=scale, enable_gqa=True).transpose(1, 2)

    def sdpa_gather():
        kg = torch.cat([k_pool[sel].flatten(0, 1), k_live[0]]).transpose(0, 1)[None]
        vg = torch.cat([v_pool[sel].flatten(0, 1), v_live[0]]).transpose(0, 1)[None]
        return F.scaled_dot_product_attention(qt, kg, vg, scale=scale, enable_gqa=True).transpose(1, 2)

    methods += [Method("sdpa_pregathered", sdpa_pre), Method("sdpa_gather_included", sdpa_gather)]
    return Bench(methods, ref, lowp)


# ----------------------------------------------------------------------------- merge


def torch_logsumexp_merge(o, lse):
    """The textbook merge: weights exp(lse_i - logsumexp(lse)) (no -inf / +inf care)."""
    total = torch.logsumexp(lse.float(), 0)
    w = torch.exp(lse.float() - total)[..., None]
    return (w * o.float()).sum(0).to(o.dtype), total


def merge_bench(case: Case, dtype, device) -> Bench:
    import triton_kernels as tk

    a = make_inputs(case, device, dtype)
    o, lse = a["o"], a["lse"]
    ref, _ = R.merge_states(o.float(), lse)
    lowp, _ = R.merge_states(o, lse)  # the same math, rounded to the dtype
    ours = (
        Method("merge_triton", lambda: tk.merge_states(o, lse, backend="triton"), ours=True)
        if device.type == "cuda"
        else Method("torch_reference", lambda: R.merge_states(o, lse), ours=True)
    )
    methods = [ours, Method("torch_logsumexp", lambda: torch_logsumexp_merge(o, lse))]
    if device.type == "cuda":
        methods.append(Method("torch_reference", lambda: R.merge_states(o, lse)))
    return Bench(methods, ref, lowp)


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


def torch_row_mass(q, k, k_extra, scale):
    """Vectorised torch: materialises [N, Hq, T, T + E] probabilities; mass on the extra keys per KV head."""
    n, t, hq, d = q.shape
    hkv = k.shape[2]
    g = hq // hkv
    keys = torch.cat([k, k_extra], 1).repeat_interleave(g, 2)  # [N, L, Hq, D]
    p = torch.softmax(torch.einsum("nthd,nlhd->nhtl", q, keys).float() * scale, -1)
    return p[..., t:].sum(-1).view(n, hkv, g, t).sum(2)  # [N, Hkv, T]


def scores_bench(case: Case, dtype, device) -> Bench:
    import triton_kernels as tk

    a = make_inputs(case, device, dtype)
    q, k, x = a["q"], a["k"], a["k_extra"]
    scale = 1 / math.sqrt(HEAD_DIM)
    if case.op == "chunk_attention_scores":
        ref = R.chunk_attention_scores(q.float(), k.float(), None, x.float(), sm_scale=scale)[0]
        lowp = torch_chunk_scores(q, k, x, scale)[0]
        name, ours_fn, rival = "chunk_scores", tk.chunk_attention_scores, torch_chunk_scores
        ref_fn = R.chunk_attention_scores
    else:
        ref = R.chunk_row_mass(q.float(), k.float(), None, x.float(), sm_scale=scale)
        lowp = torch_row_mass(q, k, x, scale)
        name, ours_fn, rival = "row_mass", tk.chunk_row_mass, torch_row_mass
        ref_fn = R.chunk_row_mass
    ours = (
        Method(f"{name}_triton", lambda: ours_fn(q, k, None, x, backend="triton"), ours=True)
        if device.type == "cuda"
        else Method("torch_reference", lambda: ref_fn(q, k, None, x), ours=True)
    )
    return Bench([ours, Method("torch_vectorised", lambda: rival(q, k, x, scale))], ref, lowp)


# ----------------------------------------------------------------------------- top-b gather


def torch_topb(scores, k, v, b):
    from triton_kernels.topb import select_topb

    idx, kept = select_topb(scores, b, None, 7, True)  # [N, H, b]
    gi = idx.clamp(min=0).transpose(1, 2)[..., None].expand(-1, -1, -1, k.shape[-1])  # [N, b, H, D]
    return torch.gather(k, 1, gi), torch.gather(v, 1, gi), idx, kept


def topb_bench(case: Case, dtype, device) -> Bench:
    import triton_kernels as tk

    a = make_inputs(case, device, dtype)
    scores, k, v, b = a["scores"], a["k"], a["v"], a["b"]
    ref = R.topb_gather(scores, k, v, b)
    ours = (
        Method("topb_triton", lambda: tk.topb_gather(scores, k, v, b, backend="triton"), ours=True)
        if device.type == "cuda"
        else Method("torch_reference", lambda: R.topb_gather(scores, k, v, b), ours=True)
    )
    methods = [ours, Method("torch_gather", lambda: torch_topb(scores, k, v, b))]
    for m in methods:  # exact check: same indices, same gathered rows
        m.check = "exact" if all(torch.equal(x, y) for x, y in zip(m.fn(), ref, strict=True)) else "FAIL"
    return Bench(methods, None, None)


BENCHES = {
    "split_s_attention": split_s_bench,
    "merge_states": merge_bench,
    "chunk_attention_scores": scores_bench,
    "chunk_row_mass": scores_bench,
    "topb_gather": topb_bench,
}


# ----------------------------------------------------------------------------- driver


def summarise(rows: list[dict], device: torch.device) -> str:
    label = "GPU" if device.type == "cuda" else "CPU"
    cols = ["op", "case", "method", "median_ms", "gbps", "tflops"]
    cols += ["pct_of_h200_bound"] if device.type == "cuda" else []
    cols += ["check", "speedup_vs_best", "best_baseline", "time_over_ours"]
    widths = {c: max([len(c)] + [len(str(r.get(c, ""))) for r in rows]) for c in cols}
    lines = [f"[{label}] " + " ".join(c.ljust(widths[c]) for c in cols)]
    for r in rows:
        lines.append(f"[{label}] " + " ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols))
    lines.append(
        f"[{label}] speedup_vs_best = fastest passing baseline's time / ours (> 1: ours is faster); "
        "time_over_ours = that method's time / ours; pct_of_h200_bound = H200 lower bound / latency (bench/roofline.py)"
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Prefilling-dLLM kernel microbenchmarks")
    ap.add_argument("--out", required=True, help="output directory for the CSV")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop starting new cases after this many s")
    ap.add_argument("--no-flex", action="store_true", help="skip the FlexAttention baselines (no compile)")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU: torch threads (default 1: on small shared CI boxes an OpenMP team can cost ms per op)",
    )
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_kernels: error: --device cuda but no CUDA device", file=sys.stderr)
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

            flex_cache["fn"] = flex_attention  # compiled per case in split_s_bench
        except Exception as exc:  # pragma: no cover - older torch
            print(f"[bench_kernels] FlexAttention unavailable: {exc}", flush=True)

    gpu = device.type == "cuda"
    dtype = torch.bfloat16 if gpu else torch.float32
    out = Path(args.out) / f"bench_kernels_{'gpu' if gpu else 'cpu'}.csv"
    rows: list[dict] = []
    t_start = time.time()
    for case in cases("gpu" if gpu else "cpu"):
        if rows and time.time() - t_start > args.budget_s:  # the first case always runs
            print(f"[bench_kernels] budget {args.budget_s:.0f}s reached: skipping {case.op} {case.name}", flush=True)
            rows.append(dict(op=case.op, case=case.name, check="SKIPPED", note="time budget"))
            continue
        t0 = time.time()
        make = BENCHES[case.op]
        bench = make(case, dtype, device, flex_cache) if case.op == "split_s_attention" else make(case, dtype, device)
        new = run_case(case, bench, dtype, device)
        for r in new:
            r["device_label"] = "GPU" if gpu else "CPU"
        rows += new
        print(f"[bench_kernels] {case.op} {case.name} done in {time.time() - t0:.1f}s", flush=True)
        write_csv(out, rows, str(device))  # rewritten after every case: a killed run keeps its rows
        if gpu:
            torch.cuda.empty_cache()

    write_csv(out, rows, str(device))
    print(summarise([r for r in rows if r.get("check") != "SKIPPED"], device))
    print(f"[bench_kernels] wrote {out} ({len(rows)} rows) in {time.time() - t_start:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
