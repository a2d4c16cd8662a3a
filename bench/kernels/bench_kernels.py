"""Kernel microbenchmarks: every op of ``triton_kernels`` against the strongest torch baselines we know.

    python -m bench.kernels.bench_kernels --out DIR [--device cuda|cpu] [--budget-s 240] [--no-flex]

Cases come from the registry ``bench/kernel_cases.py`` (``gpu`` cases in bf16 on a GPU,
``cpu`` cases in fp32 elsewhere), in priority order: the time budget cuts from the end.
Per op, side by side in one run, after a warm-up:

* ``split_s_attention``: ours (Triton on a GPU; on CPU what CPU tensors dispatch to, torch's
  fused CPU attention one row at a time, with the naive torch reference beside it) against
  - ``flex_compiled``: vanilla ``torch.compile(flex_attention)`` over the segments laid out
    as a padded pool plus the live block, with a cached ``BlockMask`` (built untimed);
  - ``flex_gqa_pad8`` (GPU, when G is not a power of two, e.g. Dream's 7): the same with each
    KV head's query group zero-padded to 8 heads, so FlexAttention can take its decoding
    kernel (power-of-two groups only), with an explicit BLOCK_M (:data:`FLEX_PAD8_OPTIONS`:
    its default errored on the H200); the pad and the un-pad are timed;
  - ``sdpa_pregathered``: ``scaled_dot_product_attention`` (``enable_gqa``) over a
    contiguous copy of the selected keys + live keys (gather untimed);
  - ``sdpa_gather_included``: the same with the gather (indexing + ``cat``) timed.
* ``merge_states``: ours against the torch reference and a plain ``torch.logsumexp`` merge.
* ``chunk_attention_scores`` / ``chunk_row_mass``: ours against vectorised torch that
  materialises the probabilities.
* ``topb_gather``: ours against torch selection + ``torch.gather``.

Every method's output is checked before it is timed, with the rule of
:mod:`triton_kernels.testing` (error <= 2 x plain torch's error in the same dtype + a
floor; top-B: exact). A method that fails its check is timed but ranks nowhere.

Timing (primitives in ``bench/kernels/gpu_timing.py``). On a GPU, per method:

* ``eager_us``: synchronise, call, synchronise (median of 30) with the default settings:
  the latency a caller who waits for the result sees, host work and any sync included;
* ``graph_us``: the GPU's own time, from CUDA-graph replay with a cold L2: the graph cycles
  through enough copies of the inputs the method reads (``copies``) that together they move
  more than twice the L2 (``cold_l2`` = 1), as FlashInfer's benchmark does;
* ``host_us``: 50 calls back to back without a sync, wall time / 50: the CPU's cost per call;
* ``pct_of_h200_bound``: the H200 lower bound (``bench/kernels/roofline.py``) over ``graph_us``;
* ``speedup_vs_best``: the fastest passing baseline's graph time over ours (> 1: ours is
  faster), naming that baseline; ``time_over_ours`` per baseline.

On a CPU there is no graph: ``eager_us`` is the median of repeated calls (value checks off) and
the speedups compare those. ``gbps`` / ``tflops``: the op's minimal work over the ranked time.

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
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.kernel_cases import HEAD_DIM, Case, cases, make_inputs
from bench.kernels import gpu_timing as T
from bench.kernels import roofline
from bench.provenance import provenance, write_csv
from triton_kernels import reference as R
from triton_kernels.testing import check_rule, lowp_attention

# ----------------------------------------------------------------------------- timing


def time_fn(fn, device: torch.device, rep_ms: int = 100) -> dict:
    """CPU: median and 20/80 % quantiles in ms of repeated calls (about a second at most).

    On a GPU :func:`time_gpu` gives three numbers instead: eager latency, CUDA-graph time and host time.
    """
    fn()  # warm-up (compile caches, allocator)
    times = []
    t_end = time.perf_counter() + 1.0
    while len(times) < 3 or (time.perf_counter() < t_end and len(times) < 50):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    qs = statistics.quantiles(times, n=5) if len(times) >= 5 else [min(times)] * 4
    return {"median_ms": statistics.median(times), "p20_ms": qs[0], "p80_ms": qs[-1]}


def time_gpu(method, inputs: dict, device: torch.device) -> dict:
    """Eager latency and host time with the default settings, graph time with a cold L2
    (``bench/kernels/gpu_timing.py``).

    The graph cycles through :func:`bench.kernels.gpu_timing.rotation_count` copies of the inputs the
    method reads (its ``reads``, default all), each captured call on its own copy; it is
    captured with the value checks off (a host sync cannot be captured).
    """
    import triton_kernels as tk

    fn = lambda: method.fn(inputs)  # noqa: E731
    fn()  # warm-up: compilation, allocator
    row = {
        "eager_us": T.eager_us(fn, 30, sync=T.cuda_sync),
        "host_us": T.host_time_us(fn, 50, sync=T.cuda_sync),
    }
    keys = list(inputs) if method.reads is None else list(method.reads)
    nbytes = max(1, T.tensor_bytes({k: inputs[k] for k in keys}))
    l2 = T.device_l2_bytes(device)
    copies = T.rotation_count(nbytes, l2)
    sets = [inputs] + [dict(inputs, **T.clone_inputs({k: inputs[k] for k in keys})) for _ in range(copies - 1)]
    with tk.skip_value_checks():
        try:
            row["graph_us"] = T.graph_time_us([lambda a=a: method.fn(a) for a in sets])
        except Exception as exc:  # a method that cannot be captured keeps its eager numbers
            row["graph_note"] = f"no graph: {type(exc).__name__}: {str(exc)[:100]}"
    row.update(copies=copies, cold_l2=int(T.is_cold(copies, nbytes, l2)))
    del sets
    return row


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
    fn: object  # (inputs dict) -> output tensor (or tuple whose [0] is compared)
    ours: bool = False
    check: str | None = None  # a verdict decided by the caller (exact comparisons)
    reads: tuple | None = None  # the input keys it reads (the cold-L2 rotation copies these); None: all
    note: str = ""
    rank: bool = True  # False: a variant timed for the record (another tile config, one phase alone), never a rival


@dataclass
class Bench:
    """What one case needs: the inputs, the methods, the fp32 reference and plain torch's low-precision output."""

    methods: list
    ref: torch.Tensor | None  # None: every method carries its own (exact) verdict
    lowp: torch.Tensor | None
    inputs: dict = field(default_factory=dict)


def _timed(row: dict, device: torch.device) -> float | None:
    """The time a row is ranked by, in us: graph time on a GPU (graph vs graph), else the eager median."""
    return row.get("graph_us") if device.type == "cuda" else row.get("eager_us")


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
        if m.note:
            row["note"] = m.note
        try:
            out = m.fn(bench.inputs)
            out = out[0] if isinstance(out, (tuple, list)) else out
            if m.check is not None:
                row.update(check=m.check)
            else:
                ok, err, tol = check_rule(out, bench.ref, bench.lowp, dtype)
                row.update(max_err=f"{err:.3e}", tol=f"{tol:.3e}", check="ok" if ok else "FAIL")
            if device.type == "cuda":
                row.update(time_gpu(m, bench.inputs, device))
            else:  # timed without the per-call value checks: they ran just above
                with _env("PREFILLING_DLLM_CHECK_VALUES", "0"):
                    t = time_fn(lambda m=m: m.fn(bench.inputs), device)
                row.update(eager_us=1e3 * t["median_ms"], p20_us=1e3 * t["p20_ms"], p80_us=1e3 * t["p80_ms"])
        except Exception as exc:  # a baseline that cannot run here is reported, not fatal
            row.update(check="ERROR", note=f"{type(exc).__name__}: {str(exc)[:160]}")
        rows.append(row)
    good = ("ok", "exact")
    ranked = [r for r in rows if r.get("check") in good and _timed(r, device)]
    ours = next((r for r in ranked if r["ours"]), None)
    rivals = {m.name for m in bench.methods if m.rank and not m.ours}
    best = min((r for r in ranked if r["method"] in rivals), key=lambda r: _timed(r, device), default=None)
    for r in rows:
        t = _timed(r, device)
        if not t:
            continue
        r["gbps"] = f"{c.bytes / (t * 1e-6) / 1e9:.1f}"
        r["tflops"] = f"{(c.mma_flops + c.simt_flops) / (t * 1e-6) / 1e12:.3f}"
        if device.type == "cuda":
            r["pct_of_h200_bound"] = f"{100 * bound_us / t:.1f}"
        if ours is not None and r["method"] in rivals:
            r["time_over_ours"] = f"{t / _timed(ours, device):.2f}"
    if ours is not None and best is not None:
        ours["speedup_vs_best"] = f"{_timed(best, device) / _timed(ours, device):.2f}"
        ours["best_baseline"] = best["method"]
    for r in rows:
        for k in ("eager_us", "graph_us", "host_us", "p20_us", "p80_us"):
            if k in r:
                r[k] = f"{r[k]:.2f}"
    return rows


# ----------------------------------------------------------------------------- split-S


def _flex(flex_cache):
    """A fresh ``torch.compile(flex_attention)`` per case (the recompile limit never drops it to eager)."""
    if flex_cache.get("fn") is None:
        return None
    torch._dynamo.reset()
    return torch.compile(flex_cache["fn"], dynamic=False)


# kernel_options that let FlexAttention's decoding kernel take a padded GQA group of 8: its default
# BLOCK_M is next_pow2(M * G), 512 at M = 64, which no 128-query block-mask block divides, so every
# config was filtered out ("NoValidChoicesError" on the H200 run). Tried in order; the first that
# compiles and passes the accuracy check is timed (its options go to the row's note).
FLEX_PAD8_OPTIONS = ({"BLOCK_M": 64}, {"BLOCK_M": 32}, {"BLOCK_M": 16})


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
    op_keys = ("q", "k_pool", "v_pool", "seg_slots", "seg_lens", "k_live", "v_live")

    def ours_fn(x, backend):
        return tk.split_s_attention(*(x[k] for k in op_keys), backend=backend)

    if device.type == "cuda":
        ours = Method("split_s_triton", lambda x: ours_fn(x, "triton"), ours=True, reads=op_keys)
        methods = [ours, _split_s_block_m128(op_keys)]
    else:  # what CPU tensors dispatch to: torch's fused CPU attention, one call per row shape
        ours = Method("split_s_cpu", lambda x: ours_fn(x, "torch"), ours=True, reads=op_keys)
        methods = [ours]
    if device.type != "cuda":  # the naive reference beside it
        methods.append(Method("torch_reference", lambda x: R.split_s_attention(*(x[k] for k in op_keys))))

    flex = _flex(flex_cache)
    if flex is not None:
        from torch.nn.attention.flex_attention import create_block_mask

        p_slots, t = k_pool.shape[0], k_pool.shape[1]
        slot_len = torch.zeros(p_slots, dtype=torch.int32, device=device)
        slot_len[sel] = lens[0]
        a["kf"] = torch.cat([k_pool.flatten(0, 1), k_live[0]]).transpose(0, 1)[None]  # [1, Hkv, P*T + M, D]
        a["vf"] = torch.cat([v_pool.flatten(0, 1), v_live[0]]).transpose(0, 1)[None]
        a["qf"] = q.transpose(1, 2)  # [1, Hq, M, D]

        def mask_mod(b, h, q_idx, kv_idx):
            slot = torch.clamp(kv_idx // t, max=p_slots - 1)
            return torch.where(kv_idx < p_slots * t, (kv_idx % t) < slot_len[slot], True)

        block_mask = create_block_mask(mask_mod, 1, None, m, p_slots * t + m, device=str(device))  # cached
        methods.append(
            Method(
                "flex_compiled",
                lambda x: flex(
                    x["qf"], x["kf"], x["vf"], block_mask=block_mask, scale=scale, enable_gqa=True
                ).transpose(1, 2),
                reads=("qf", "kf", "vf"),
            )
        )
        g8 = 1 << (g - 1).bit_length()
        if device.type == "cuda" and g8 != g:
            methods.append(_flex_pad8(flex, a, block_mask, m, hq, hkv, g, g8, scale))

    a["kc"], a["vc"] = k_cat.transpose(0, 1)[None], v_cat.transpose(0, 1)[None]  # [1, Hkv, keys, D] (views)
    a["qt"] = q.transpose(1, 2)

    def sdpa_pre(x):
        return F.scaled_dot_product_attention(x["qt"], x["kc"], x["vc"], scale=scale, enable_gqa=True).transpose(1, 2)

    def sdpa_gather(x):
        s_ = x["seg_slots"][0].long()
        kg = torch.cat([x["k_pool"][s_].flatten(0, 1), x["k_live"][0]]).transpose(0, 1)[None]
        vg = torch.cat([x["v_pool"][s_].flatten(0, 1), x["v_live"][0]]).transpose(0, 1)[None]
        return F.scaled_dot_product_attention(x["qt"], kg, vg, scale=scale, enable_gqa=True).transpose(1, 2)

    methods += [
        Method("sdpa_pregathered", sdpa_pre, reads=("qt", "kc", "vc")),
        Method("sdpa_gather_included", sdpa_gather, reads=("qt", "k_pool", "v_pool", "seg_slots", "k_live", "v_live")),
    ]
    return Bench(methods, ref, lowp, a)


def _split_s_block_m128(op_keys) -> Method:
    """Ours with 128-row query tiles (two warpgroups, 8 warps) instead of the plan's 64, split as the
    plan's cost model splits them: a variant timed for the record (which wgmma tile the
    H200 prefers), not a rival."""
    from triton_kernels.split_s import split_s_launch

    def fn(x):
        q = x["q"]
        scale = 1 / math.sqrt(q.shape[-1])
        return split_s_launch(*(x[k] for k in op_keys), scale, None, block_m=128)

    return Method("split_s_triton_bm128", fn, reads=op_keys, rank=False, note="BLOCK_M=128, 8 warps; not ranked")


def _flex_pad8(flex, a, block_mask, m, hq, hkv, g, g8, scale) -> Method:
    """FlexAttention with each KV head's query group zero-padded to ``g8`` heads (its decoding kernel
    takes power-of-two groups only); the pad and the un-pad are timed. The first of
    :data:`FLEX_PAD8_OPTIONS` that compiles here is kept."""

    def make(opts):
        def flex_pad(x):
            qp = x["q"].new_zeros(1, m, hkv, g8, HEAD_DIM)
            qp[:, :, :, :g] = x["q"].view(1, m, hkv, g, HEAD_DIM)
            o = flex(qp.view(1, m, hkv * g8, HEAD_DIM).transpose(1, 2), x["kf"], x["vf"], block_mask=block_mask,
                     scale=scale, enable_gqa=True, kernel_options=opts)  # fmt: skip
            return o.transpose(1, 2).reshape(1, m, hkv, g8, HEAD_DIM)[:, :, :, :g].reshape(1, m, hq, HEAD_DIM)

        return flex_pad

    errors = []
    for opts in FLEX_PAD8_OPTIONS:
        fn = make(opts)
        try:
            fn(a)  # compiles (untimed)
        except Exception as exc:
            errors.append(f"{opts}: {type(exc).__name__}")
            continue
        return Method("flex_gqa_pad8", fn, reads=("q", "kf", "vf"), note=f"kernel_options={opts}")

    def failed(x):
        raise RuntimeError("no FlexAttention decoding config compiled: " + "; ".join(errors))

    return Method("flex_gqa_pad8", failed)


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
        Method("merge_triton", lambda x: tk.merge_states(x["o"], x["lse"], backend="triton"), ours=True)
        if device.type == "cuda"
        else Method("torch_reference", lambda x: R.merge_states(x["o"], x["lse"]), ours=True)
    )
    methods = [ours, Method("torch_logsumexp", lambda x: torch_logsumexp_merge(x["o"], x["lse"]))]
    if device.type == "cuda":
        methods.append(Method("torch_reference", lambda x: R.merge_states(x["o"], x["lse"])))
    return Bench(methods, ref, lowp, a)


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
        Method(f"{name}_triton", lambda a_: ours_fn(a_["q"], a_["k"], None, a_["k_extra"], backend="triton"), ours=True)
        if device.type == "cuda"
        else Method("torch_reference", lambda a_: ref_fn(a_["q"], a_["k"], None, a_["k_extra"]), ours=True)
    )
    rival_m = Method("torch_vectorised", lambda a_: rival(a_["q"], a_["k"], a_["k_extra"], scale))
    return Bench([ours, rival_m], ref, lowp, a)


# ----------------------------------------------------------------------------- top-b gather


def torch_topb(scores, k, v, b, lens=None):
    """The torch baseline: the vectorised torch selection (max-pool + two stable sorts) + ``torch.gather``."""
    from triton_kernels.topb import select_topb

    idx, kept = select_topb(scores, b, lens, 7, True)  # [N, H, b]
    gi = idx.clamp(min=0).transpose(1, 2)[..., None].expand(-1, -1, -1, k.shape[-1])  # [N, b, H, D]
    return torch.gather(k, 1, gi), torch.gather(v, 1, gi), idx, kept


def torch_gather_rows(idx, k, v):
    """``torch.gather`` of the rows ``idx [N, H, b]`` (-1: zeros) of ``k, v [N, T, H, D]`` into ``[N, b, H, D]``."""
    gi = idx.clamp(min=0).transpose(1, 2)[..., None].expand(-1, -1, -1, k.shape[-1])  # [N, b, H, D] int64
    pad = (idx < 0).transpose(1, 2)[..., None]
    return torch.gather(k, 1, gi).masked_fill(pad, 0), torch.gather(v, 1, gi).masked_fill(pad, 0)


def topb_bench(case: Case, dtype, device) -> Bench:
    import triton_kernels as tk

    a = make_inputs(case, device, dtype)
    scores, k, v, b = a["scores"], a["k"], a["v"], a["b"]
    ref = R.topb_gather(scores, k, v, b, lens=a["lens"])
    keys = ("scores", "k", "v", "lens")
    ours = (
        Method(
            "topb_triton",  # two kernels: selection (_select_topb_kernel) and gather (_gather_rows_kernel)
            lambda x: tk.topb_gather(x["scores"], x["k"], x["v"], b, lens=x["lens"], backend="triton"),
            ours=True,
        )
        if device.type == "cuda"
        else Method(
            "torch_reference", lambda x: R.topb_gather(x["scores"], x["k"], x["v"], b, lens=x["lens"]), ours=True
        )
    )
    methods = [ours, Method("torch_gather", lambda x: torch_topb(x["scores"], x["k"], x["v"], b, x["lens"]))]
    for m in methods:  # exact check: same indices, same gathered rows
        m.reads = keys
        m.check = "exact" if all(torch.equal(x, y) for x, y in zip(m.fn(a), ref, strict=True)) else "FAIL"
    if device.type == "cuda":  # the copy alone, from the same indices: our kernel vs torch.gather
        from triton_kernels.topb import gather_rows_launch

        a["idx"] = ref[2]
        copy_keys = ("idx", "k", "v")
        gathers = [
            Method("gather_kernel_only", lambda x: gather_rows_launch(x["idx"], x["k"], x["v"]), rank=False),
            Method("torch_gather_only", lambda x: torch_gather_rows(x["idx"], x["k"], x["v"]), rank=False),
        ]
        for m in gathers:
            m.reads, m.note = copy_keys, "copy only (selection excluded); not ranked"
            m.check = "exact" if all(torch.equal(x, y) for x, y in zip(m.fn(a), ref[:2], strict=True)) else "FAIL"
        methods += gathers
        from triton_kernels.topb import select_launch, select_topb

        selects = [  # the selection alone: our kernel vs the torch selection of the baseline
            Method("select_kernel_only", lambda x: select_launch(x["scores"], b, x["lens"], 7, True), rank=False),
            Method("torch_select_only", lambda x: select_topb(x["scores"], b, x["lens"], 7, True), rank=False),
        ]
        for m in selects:
            m.reads, m.note = ("scores", "lens"), "selection only (idx, kept); not ranked"
            m.check = "exact" if all(torch.equal(x, y) for x, y in zip(m.fn(a), ref[2:], strict=True)) else "FAIL"
        methods += selects
    return Bench(methods, None, None, a)


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
    cols = ["op", "case", "method", "eager_us"]
    cols += ["graph_us", "host_us", "pct_of_h200_bound"] if device.type == "cuda" else []
    cols += ["gbps", "tflops"]
    cols += ["check", "speedup_vs_best", "best_baseline", "time_over_ours"]
    widths = {c: max([len(c)] + [len(str(r.get(c, ""))) for r in rows]) for c in cols}
    lines = [f"[{label}] " + " ".join(c.ljust(widths[c]) for c in cols)]
    for r in rows:
        lines.append(f"[{label}] " + " ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols))
    lines.append(
        f"[{label}] speedup_vs_best = fastest passing baseline's time / ours (> 1: ours is faster; on a GPU "
        "graph time vs graph time); time_over_ours = that method's time / ours; eager_us = sync, call, sync with "
        "the default settings; graph_us = CUDA-graph replay, cold L2; host_us = back-to-back calls, no sync; "
        "pct_of_h200_bound = H200 lower bound / graph time (bench/kernels/roofline.py)"
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
