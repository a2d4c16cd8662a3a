"""Kernel launches and host reads of one prefilling denoising step at Dream-7B's layout, counted on a CPU.

    python -m bench.kernels.decode_launches [--out DIR] [--layers 28] [--gen 32] [--chunk 1024]

In a CUDA graph a short kernel still costs its launch latency and drain (3-4 us), so the
step's kernel count decides much of its time. This counts, without a GPU, the launches a CUDA step
would issue: the model (Dream-v0-7B's 28 layers and 28 / 4 heads at tiny widths,
:func:`bench.speed.host_step.host_config`) runs one prefilling step's forward
(``PrefillingPolicy.logits``) with every ``triton_kernels`` op on its CUDA branch
(``PREFILLING_DLLM_BACKEND=triton``, planned for the H200: :func:`triton_kernels.plan.assume_gpu`) inside
:func:`triton_kernels._launch.stub_launches`, which records each Triton launch and runs none. A
``TorchDispatchMode`` counts the aten ops that would be kernels (views and bare allocations left out;
the package's registered ops are counted by their Triton launches instead). Both model paths:
``torch`` (``fused_ops = False``) and ``fused`` (Triton add + RMSNorm, RoPE, SwiGLU and the merged
q/k/v and gate/up GEMMs).

Then the rest of the step, what runs outside a captured forward (unmasking, write-back): the same
denoising loop with the forward replaced by a replay stand-in returning fixed logits (as
:func:`bench.speed.host_step.measure_host_step` does), counting its ops and its host reads (scalar
reads and data-dependent shapes: each one a device-to-host sync on CUDA) per step.

Output: ``decode_launches.md`` (the tables and the command). Counts, not times: no GPU figure here.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bench.outputs import save_text
from bench.provenance import machine_line

GEMMS = ("mm", "addmm", "bmm", "baddbmm", "_addmm_activation")
# aten ops that launch nothing on CUDA: allocations, metadata and view-like reshapes
NO_KERNEL = ("empty", "empty_strided", "empty_like", "lift_fresh", "_to_copy_meta", "detach", "_unsafe_view")
NO_KERNEL += ("promote_types",)
HOST_READS = ("_local_scalar_dense", "nonzero", "masked_select", "is_nonzero", "equal", "unique", "_unique2", "item")


class LaunchCount(TorchDispatchMode):
    """Counts, by name, the aten ops dispatched inside that would launch a kernel on CUDA, and host reads."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in HOST_READS:
            self.reads += 1
        if func.namespace == "aten" and not func.is_view and name not in NO_KERNEL:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _triton_backend():
    """Every ``triton_kernels`` op on its CUDA branch (stubbed launches), whatever the tensors' device."""
    old = os.environ.get("PREFILLING_DLLM_BACKEND")
    os.environ["PREFILLING_DLLM_BACKEND"] = "triton"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PREFILLING_DLLM_BACKEND", None)
        else:
            os.environ["PREFILLING_DLLM_BACKEND"] = old


def classify(ops: collections.Counter, triton: collections.Counter) -> dict:
    """Launch counts by class: ``GEMM`` (aten matrix products), ``Triton`` (the package's kernels), ``other
    aten`` (elementwise, reductions, copies, SDPA), and ``total``."""
    gemm = sum(n for k, n in ops.items() if k in GEMMS)
    other = sum(n for k, n in ops.items() if k not in GEMMS)
    tri = sum(triton.values())
    return {"GEMM": gemm, "Triton": tri, "other aten": other, "total": gemm + tri + other}


def count_forward(policy, resp: torch.Tensor, fused: bool) -> tuple[dict, collections.Counter, collections.Counter]:
    """``(classes, aten ops, Triton launches)`` of one ``policy.logits(resp)`` on the ``fused`` or torch path
    (the CUDA branch's Python path, launches stubbed)."""
    from triton_kernels._launch import stub_launches
    from triton_kernels.plan import H200, assume_gpu

    model = policy.model
    model.fused_ops = fused
    try:  # planned for the H200 (split-S's partials and merge as there), launched nowhere
        with torch.no_grad(), _triton_backend(), assume_gpu(H200), stub_launches() as record:
            policy.logits(resp)  # first call: merges the projections, prepares plans
            del record[:]
            with LaunchCount() as count:
                policy.logits(resp)
    finally:
        model.fused_ops = None
    triton = collections.Counter(name for name, _grid in record)
    return classify(count.ops, triton), count.ops, triton


def count_outside(model, parts, pcfg, gen: int) -> dict:
    """Ops and host reads per denoising step outside the captured forward (median over the loop's steps)."""
    from bench.speed.host_step import _ReplayStandIn
    from dllm.decode.denoise import denoise
    from dllm.decode.timer import PhaseTimer
    from dllm.decode.unmasking import UnmaskingConfig
    from dllm.prefilling import build_prefilling_policy

    cfg = model.config
    pol = build_prefilling_policy(model, None, parts, pcfg, PhaseTimer("cpu"), gen_length=gen).policy
    with torch.no_grad():
        pol.graph = _ReplayStandIn(pol.logits(torch.full((1, gen), cfg.mask_token_id)).clone())
    steps: list[tuple[int, int]] = []

    class Clock:  # a PhaseTimer stand-in: one LaunchCount per "decode" phase (one step)
        def phase(self, name):
            class _P(LaunchCount):
                def __exit__(self, *exc):
                    out = super().__exit__(*exc)
                    if name == "decode":
                        steps.append((sum(self.ops.values()), self.reads))
                    return out

            return _P()

    resp = torch.full((1, gen), cfg.mask_token_id)
    denoise(
        pol, resp, mask_id=cfg.mask_token_id, block_length=gen, steps_per_block=gen,
        cfg=UnmaskingConfig(alg="maskgit_plus"), timer=Clock(),
    )  # fmt: skip
    return {
        "ops": int(statistics.median(s[0] for s in steps)),
        "reads": int(statistics.median(s[1] for s in steps)),
        "max_reads": max(s[1] for s in steps),
        "steps": len(steps),
    }


PREFIX, QUERY = 16, 40  # bench/speed/decode_step.py's step: a 16-token prefix, 4 kept chunks, a 40-token query


def run(layers: int = 28, gen: int = 32, chunk: int = 1024) -> dict:
    """Build the tiny-width Dream-layout model (bf16, as on the GPU: the torch path's casts are kernels there)
    and its prefilling policy on CPU over a prefix + 4 chunks of ``chunk`` tokens + the query; count both
    forward paths and the step's outside-the-forward work. Returns a dict of the counts (see :func:`report`)."""
    from bench.speed.e2e_dream_shape import build_random_model
    from bench.speed.host_step import host_config
    from dllm.decode.timer import PhaseTimer
    from dllm.prefilling import PrefillingConfig, PromptParts, build_prefilling_policy

    cfg = host_config(layers)
    model = build_random_model(cfg, "cpu", torch.bfloat16, seed=0)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size - 3, (PREFIX + 4 * chunk + QUERY,), generator=g)
    ids[0] = cfg.bos_token_id
    parts = PromptParts(ids[:PREFIX], ids[PREFIX:-QUERY], ids[-QUERY:])
    pcfg = PrefillingConfig(chunk_size=chunk, top_k=4)
    pol = build_prefilling_policy(model, None, parts, pcfg, PhaseTimer("cpu"), gen_length=gen).policy
    resp = torch.full((1, gen), cfg.mask_token_id)
    out = {"layers": layers, "gen": gen, "chunk": chunk}
    for path in ("torch", "fused"):
        classes, ops, triton = count_forward(pol, resp, path == "fused")
        out[path] = dict(classes=classes, ops=ops, triton=triton)
    out["outside"] = count_outside(model, parts, pcfg, gen)
    return out


def report(r: dict, *, command: str, machine: str) -> str:
    """The markdown of ``decode_launches.md`` from :func:`run`'s counts."""
    t, f, o = r["torch"]["classes"], r["fused"]["classes"], r["outside"]
    n = r["layers"]
    lines = [
        "# Kernel launches per prefilling denoising step at Dream-7B's layout (counted on a CPU)",
        "",
        f"Command: `{command}`  ",
        f"{machine}.",
        "",
        f"Model: Dream-v0-7B's {n} layers and 28 / 4 heads at tiny widths (counts do not depend on widths); one "
        f"row, bf16, a {QUERY}-token query and {r['gen']} response tokens over a {PREFIX}-token prefix + 4 kept chunks "
        f"of {r['chunk']} tokens (`bench/speed/decode_step.py`'s step). The forward is "
        "`PrefillingPolicy.logits` with every `triton_kernels` op on its CUDA branch, planned for the H200 "
        "(launches stubbed and recorded); aten ops that would be kernels are counted by dispatch (views, "
        "allocations left out).",
        "",
        "| per step | torch path | fused path | per layer (torch -> fused) |",
        "|---|---:|---:|---|",
    ]
    for k in ("GEMM", "Triton", "other aten", "total"):
        lines.append(f"| forward: {k} launches | {t[k]} | {f[k]} | {t[k] / n:.2f} -> {f[k] / n:.2f} |")
    lines += [
        f"| outside the graph (unmasking, write-back): aten ops | {o['ops']} | {o['ops']} | |",
        f"| outside the graph: host reads (syncs) per step | {o['reads']} | {o['reads']} | |",
        "",
        f"Outside the graph: median over the loop's {o['steps']} steps (most host reads in one step: "
        f"{o['max_reads']}).",
        "",
        "Triton launches of the fused forward: "
        + ", ".join(f"`{k}` {v}" for k, v in sorted(r["fused"]["triton"].items())),
        "",
        "Aten ops of the fused forward: " + ", ".join(f"`{k}` {v}" for k, v in r["fused"]["ops"].most_common()),
        "",
        "Aten ops of the torch forward: " + ", ".join(f"`{k}` {v}" for k, v in r["torch"]["ops"].most_common()),
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/bench", help="output folder (default: runs/bench, git-ignored)")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--chunk", type=int, default=1024)
    args = ap.parse_args(argv)
    if args.layers < 1 or args.gen < 1 or args.chunk < 1:
        print("error: --layers, --gen and --chunk must be >= 1", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    r = run(args.layers, args.gen, args.chunk)
    cmd = " ".join(["python -m bench.kernels.decode_launches", *(sys.argv[1:] if argv is None else argv)])
    machine = f"{machine_line('cpu')}; {time.perf_counter() - t0:.0f} s"
    text = report(r, command=cmd, machine=machine)
    save_text(args.out, "decode_launches.md", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
