"""Host time of one op call on its CUDA branch, measured without a GPU.

Runs each public op the way it runs on CUDA tensors (backend ``triton``, the CUDA value-check
policy: no host read of index values) on CPU tensors, with the kernel launch stubbed
(:func:`triton_kernels._launch.stub_launches`): what is timed is the op's Python path --
the metadata signature and its prepared call (validation, plan and launch arguments made once per
signature), the value-check policy, output allocation and the launch record's checks -- up to the
compiled kernel's C launcher, which the stub replaces (about 2-3 us per launch on a GPU host, not
counted here). Plans are made for an H200 (:func:`triton_kernels.plan.assume_gpu`).

The tensors are small (the host path does not depend on their size): shapes are Dream-7B's heads (Hq = 28,
Hkv = 4, D = 128) with few tokens. Prints and records, per op, the minimum over repeats of the
mean host time per call, and the kernel launches per call.

Usage: ``python -m bench.kernels.host_time [--calls N] [--repeats R] [--out bench/results/host_time_cpu.md]``
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import triton_kernels as tk
from bench.outputs import write_report
from triton_kernels import _dispatch, _launch
from triton_kernels.plan import H200, assume_gpu

LIMITS_US = {"split_s_attention": 25.0}  # host-time budget per call in us; every other op: 15 us
LAUNCH_LIMITS = {"split_s_attention": 2}


def cases(dtype=torch.bfloat16) -> dict:
    """``{name: (fn, description)}``: each fn makes one call of the op on its CUDA branch."""
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    b, m, hq, hkv, d, t, k = 1, 64, 28, 4, 128, 64, 4
    q, kp, vp = r(b, m, hq, d), r(k, t, hkv, d), r(k, t, hkv, d)
    kl, vl = r(b, m, hkv, d), r(b, m, hkv, d)
    slots = torch.arange(k, dtype=torch.int32)[None]
    lens = torch.full((b, k), t, dtype=torch.int32)
    o, lse = torch.randn(4, b * m, hq, d), torch.randn(4, b * m, hq)
    n = 4
    cq, ck, cx = r(n, 16, hq, d), r(n, t, hkv, d), r(n, 16, hkv, d)
    rq = r(n, t, hq, d)
    clens = torch.full((n,), t, dtype=torch.int32)
    scores = torch.randn(n, hkv, t, generator=g)
    t_long = 1024  # the paper's C = 1024: the plan splits the segments, phase 1 + the merge
    kp_long, vp_long = r(k, t_long, hkv, d), r(k, t_long, hkv, d)
    lens_long = torch.full((b, k), t_long, dtype=torch.int32)
    tri = dict(backend="triton")
    return {
        "split_s_attention": (
            lambda: tk.split_s_attention(q, kp, vp, slots, lens, kl, vl, **tri),
            f"Dream heads, K={k} segments of T={t}, M={m} live queries, with live K/V (one partial)",
        ),
        "split_s_attention, C=1024": (
            lambda: tk.split_s_attention(q, kp_long, vp_long, slots, lens_long, kl, vl, **tri),
            f"as above with segments of T={t_long}: the plan's partials and their merge",
        ),
        "merge_states": (lambda: tk.merge_states(o, lse, **tri), f"4 partials of {b * m} x {hq} rows, D={d}"),
        "chunk_attention_scores": (
            lambda: tk.chunk_attention_scores(cq, ck, clens, cx, **tri),
            f"{n} chunks, 16 scoring queries, extra keys",
        ),
        "chunk_row_mass": (lambda: tk.chunk_row_mass(rq, ck, clens, cx, **tri), f"{n} chunks of {t} tokens"),
        "topb_gather": (
            lambda: tk.topb_gather(scores, ck, ck, 16, lens=clens, **tri),
            f"{n} chunks of {t} tokens, B=16 (selection and gather: two kernels)",
        ),
    }


def measure(calls: int = 2000, repeats: int = 5) -> list[dict]:
    """Per op: ``{"op", "us", "launches", "what"}``, host microseconds per call (min over repeats)."""
    rows = []
    with _launch.stub_launches() as record, _dispatch.cuda_check_policy_on("cpu"), assume_gpu(H200):
        for name, (fn, what) in cases().items():
            for _ in range(3):  # warm: plans, the launch cache, the error word
                fn()
            record.clear()
            fn()
            launches = len(record)
            best = float("inf")
            for _ in range(repeats):
                t0 = time.thread_time()  # CPU time of this thread: robust to a loaded machine
                for _ in range(calls):
                    fn()
                best = min(best, (time.thread_time() - t0) / calls)
            record.clear()
            rows.append(dict(op=name, us=best * 1e6, launches=launches, what=what))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None, help="Markdown report to write (default: print only)")
    args = ap.parse_args(argv)
    if args.calls < 1 or args.repeats < 1:
        ap.error("--calls and --repeats must be >= 1")
    torch.set_num_threads(1)
    t0 = time.time()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    rows = measure(args.calls, args.repeats)
    lines = ["| op | host us / call | limit | launches / call | case |", "|---|---:|---:|---:|---|"]
    for r in rows:
        limit = LIMITS_US.get(r["op"].split(",")[0], 15.0)
        lines.append(f"| {r['op']} | {r['us']:.1f} | {limit:.0f} | {r['launches']} | {r['what']} |")
    paragraphs = [
        "\n".join(lines),
        "Host time of one call on the ops' CUDA branch (backend triton, no host read of index values, "
        "plans for an H200), with the kernel launch stubbed: the Python path up to the compiled kernel's "
        "C launcher (about 2-3 us a launch on a GPU host, not included). Minimum over "
        f"{args.repeats} repeats of the mean of {args.calls} back-to-back calls, one CPU thread. "
        "CPU tensors stand in for CUDA ones, so torch's own per-op cost is the CPU dispatcher's, "
        "lower than CUDA's (each torch op on CUDA tensors costs a few us of host time more). "
        f"Load average (1 min) at the start: {load:.1f} on this machine's cores (other processes).",
    ]
    if args.out:
        write_report(args.out, "Host time per op call (CUDA branch, launch stubbed)", "bench.kernels.host_time", argv,
                     "cpu", time.time() - t0, paragraphs)  # fmt: skip
    else:
        print(paragraphs[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
