"""Host time of one prefilling denoising step at Dream-7B's layout, measured on this CPU, beside its predicted
H200 GPU time: is the GPU kept busy, eager or from a CUDA graph?

    python -m bench.speed.host_step [--layers 28] [--rounds 10] [--threads 1] [--out DIR]

:func:`measure_host_step` runs one prefilling step at Dream-v0-7B's layer and head layout with tiny widths
(:func:`host_config`), so that its arithmetic is negligible and what is timed is host work: the eager step, and
what a CUDA-graph step leaves on the host (everything outside the captured forward; the replay call itself is an
assumed cost, :data:`REPLAY_HOST_S`). :func:`predict_step_gpu_s` is the same step's GPU time by the roofline of
:func:`bench.speed.e2e_dream_shape.predict_cell_s`. :func:`host_report` writes ``e2e_dream_shape_host.md``.
Split from :mod:`bench.speed.e2e_dream_shape` (whose ``--host-time`` flag it was) to keep each file to one
measurement; it reads that module's roofline. Writes ``e2e_dream_shape_host.md`` to ``--out`` (default
``runs/bench/``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import torch

from bench.outputs import REPO_ROOT, save_text
from bench.provenance import machine_line
from bench.speed import flop_model
from bench.speed.e2e_dream_shape import (
    HBM_EFFICIENCY,
    HOST_S_PER_LAYER,
    MMA_EFFICIENCY,
    PREFIX_TOKENS,
    QUERY_TOKENS,
    _forward_s,
    build_random_model,
    dream7b_config,
    n_params,
)
from dllm import ModelConfig, PrefillingConfig, PromptParts

# The replay call of a captured step cannot run without CUDA: its host cost is an assumption, kept apart.
# Published measurements of the CPU time of one graph launch: CUDA.jl's documentation (a graph of 80
# kernels launched with 3.5 us of CPU time; a 4-layer MLP graph with 8 us,
# https://cuda.juliagpu.org/dev/usage/graphs/) and a cudaGraphLaunch probe on CUDA 13.3 (about 15 us
# fixed per replay, host and device together, https://github.com/ahrefs/ocannl/issues/488). We assume
# 20 us for ``torch.cuda.CUDAGraph.replay()`` with its Python call: above both figures (a pessimistic bound).
REPLAY_HOST_S = 20e-6
# Host cost of one eager kernel launch on CUDA, for the predicted eager line: 2.65 us per asynchronous
# enqueue and 6.4 us per launch with its share of the synchronisation, measured by the same probe (ocannl #488).
LAUNCH_HOST_S = (2.65e-6, 6.4e-6)
# The host-time step's live block (query + response) and cache (prefix + 4 chunks), small so that its
# arithmetic is negligible: the host work of a step does not depend on these lengths.
HOST_GEN, HOST_QUERY, HOST_PREFIX, HOST_CHUNK = 8, 4, 4, 8
GPU_GEN = 32  # the predicted GPU step: bench's default response of 32 tokens (+ the 48-token query)


def host_config(num_layers: int = 28) -> ModelConfig:
    """Dream-v0-7B's layer and head layout (28 layers, 28 query / 4 KV heads: GQA group 7, D = 16 as the
    smallest head the kernels take) at tiny widths (hidden 28, SwiGLU 32, vocabulary 512), so that a step's
    arithmetic is negligible on a CPU and what is left is host work: op dispatch, Python, the unmasking
    rule's bookkeeping. ``num_layers`` < 28 only for the CPU test."""
    return dataclasses.replace(
        dream7b_config(),
        vocab_size=512,
        hidden_size=28,
        intermediate_size=32,
        num_layers=num_layers,
        num_heads=28,
        num_kv_heads=4,
        head_dim=16,
        mask_token_id=511,
        bos_token_id=510,
        eos_token_id=509,
        pad_token_id=509,
    )


class _StepClock:
    """A stand-in for :class:`~dllm.decode.timer.PhaseTimer` that records each ``decode`` phase (one
    denoising step: forward, unmasking, write-back) as thread CPU seconds and wall seconds."""

    def __init__(self):
        self.cpu, self.wall = [], []

    def phase(self, name):
        clock = self

        class _Phase:
            def __enter__(self):
                self.c0, self.w0 = time.thread_time(), time.perf_counter()

            def __exit__(self, *exc):
                if name == "decode":
                    clock.cpu.append(time.thread_time() - self.c0)
                    clock.wall.append(time.perf_counter() - self.w0)
                return False

        return _Phase()


class _ReplayStandIn:
    """What ``GraphedStep`` returns on every replay: the same output buffer; here a fixed tensor, so the
    step's host work outside the captured forward (write of the live block, unmasking, write-back) runs
    as it would under a graph, and the forward itself costs no host time (its GPU time is predicted)."""

    def __init__(self, out: torch.Tensor):
        self.out = out

    def __call__(self) -> torch.Tensor:
        return self.out


_NO_KERNEL = ("empty", "empty_strided", "empty_like", "lift_fresh", "_to_copy_meta")


class _OpCounter:
    """A stand-in for :class:`~dllm.decode.timer.PhaseTimer` that counts the aten operations dispatched
    inside each ``decode`` phase (one denoising step): ``all`` and ``computing`` (views and bare allocations
    left out: they launch no kernel on CUDA, where each other op is about one kernel launch)."""

    def __init__(self):
        self.all, self.computing = [], []

    def phase(self, name):
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class _Count(TorchDispatchMode):
            def __enter__(self):
                self.n = [0, 0]
                return super().__enter__()

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                self.n[0] += 1
                if not func.is_view and func.overloadpacket.__name__ not in _NO_KERNEL:
                    self.n[1] += 1
                return func(*args, **(kwargs or {}))

            def __exit__(self, *exc):
                out = super().__exit__(*exc)
                if name == "decode":
                    counter.all.append(self.n[0])
                    counter.computing.append(self.n[1])
                return out

        return _Count()


def predict_step_gpu_s(cfg: ModelConfig, gen: int, chunk: int, top_k: int, token_budget: int | None = None) -> float:
    """Predicted H200 GPU seconds of one prefilling denoising step (bf16), host time excluded.

    The decode forward of :func:`predict_cell_s` (query of :data:`QUERY_TOKENS` + ``gen`` response tokens
    over the prefix and ``top_k`` kept chunks of ``chunk`` + 1 tokens, every weight read once):
    ``max(FLOPs at MMA_EFFICIENCY, bytes at HBM_EFFICIENCY)``, without the ``HOST_S_PER_LAYER`` term.
    Independent of the context length once it holds ``top_k`` chunks. A prediction, not a measurement.
    """
    a = flop_model.Arch.of(cfg)
    kept = PREFIX_TOKENS + top_k * (chunk + 1 if token_budget is None else token_budget + 1)
    live = QUERY_TOKENS + gen
    return _forward_s(a, 2.0 * n_params(cfg), live, kept + live, gen, kv_tokens=kept) - HOST_S_PER_LAYER * a.layers


def measure_host_step(cfg: ModelConfig, *, rounds: int = 10, gen: int = HOST_GEN, seed: int = 0) -> dict:
    """Host seconds of one prefilling denoising step on this CPU, eager and as a CUDA-graph step leaves it.

    Builds a random fp32 model of ``cfg`` (:func:`host_config`: Dream-7B's layers and heads, tiny widths), a
    prompt of a :data:`HOST_PREFIX`-token prefix, 4 chunks of :data:`HOST_CHUNK` tokens (all kept, K = 4) and a
    :data:`HOST_QUERY`-token query, and the prefilling policy over it; then decodes ``gen`` tokens in ``gen``
    steps (``maskgit_plus``, greedy: Dream's default of one token per step) ``rounds`` times in each mode,
    alternating the order (after one untimed run of each):

    * ``eager``: the step as :func:`dllm.decode.denoise.denoise` runs it on CPU (forward over the static
      cache, batched unmasking, write-back);
    * ``graph``: the same loop with the forward replaced by a stand-in for ``GraphedStep`` that returns a
      fixed logits buffer (what a replay returns): what stays on the host under a CUDA graph, less the
      replay call itself (:data:`REPLAY_HOST_S`, assumed and reported apart).

    Each step is timed as thread CPU seconds (``time.thread_time``) and wall seconds over the loop's
    ``decode`` phase (forward, unmasking, write-back; the loop's candidate mask and step counter, 3 small
    ops, lie outside it); the figures are medians over all timed steps. One more untimed run per mode counts
    the aten ops each step dispatches (views and bare allocations left out: about one CUDA kernel each).

    Returns:
        dict: ``eager_cpu_s``, ``eager_wall_s``, ``graph_cpu_s``, ``graph_wall_s``, ``forward_cpu_s``
        (eager - graph), ``eager_ops``, ``graph_ops`` (aten ops of one step that compute: views and allocations
        left out), ``steps`` (timed per mode), ``rounds``, ``layers``,
        ``threads``, ``kept_tokens``, ``live_tokens``.

    Raises:
        ValueError: ``rounds`` or ``gen`` < 1.
    """
    import statistics

    from dllm.decode.denoise import denoise
    from dllm.decode.timer import PhaseTimer
    from dllm.decode.unmasking import UnmaskingConfig
    from dllm.prefilling import build_prefilling_policy

    if rounds < 1 or gen < 1:
        raise ValueError(f"rounds and gen must be >= 1, got {rounds} and {gen}")
    model = build_random_model(cfg, "cpu", torch.float32, seed=seed)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size - 3, (HOST_PREFIX + 4 * HOST_CHUNK + HOST_QUERY,), generator=g)
    ids[0] = cfg.bos_token_id
    parts = PromptParts(ids[:HOST_PREFIX], ids[HOST_PREFIX:-HOST_QUERY], ids[-HOST_QUERY:])
    pcfg = PrefillingConfig(chunk_size=HOST_CHUNK, top_k=4)
    ucfg = UnmaskingConfig(alg="maskgit_plus")

    def policy():
        return build_prefilling_policy(model, None, parts, pcfg, PhaseTimer("cpu"), gen_length=gen).policy

    eager_pol = policy()
    fixed = eager_pol.logits(torch.full((1, gen), cfg.mask_token_id)).clone()
    graph_pol = policy()
    graph_pol.graph = _ReplayStandIn(fixed)

    def run(pol, clock):
        resp = torch.full((1, gen), cfg.mask_token_id)
        denoise(pol, resp, mask_id=cfg.mask_token_id, block_length=gen, steps_per_block=gen, cfg=ucfg, timer=clock)

    clocks = {"eager": _StepClock(), "graph": _StepClock()}
    pols = {"eager": eager_pol, "graph": graph_pol}
    for mode in pols:  # untimed warm-up
        run(pols[mode], _StepClock())
    for r in range(rounds):
        for mode in ("eager", "graph") if r % 2 == 0 else ("graph", "eager"):
            run(pols[mode], clocks[mode])

    ops = {"eager": _OpCounter(), "graph": _OpCounter()}
    for mode in pols:  # one more untimed run, counting the ops of each step
        run(pols[mode], ops[mode])

    med = statistics.median
    out = {
        "eager_cpu_s": med(clocks["eager"].cpu),
        "eager_wall_s": med(clocks["eager"].wall),
        "graph_cpu_s": med(clocks["graph"].cpu),
        "graph_wall_s": med(clocks["graph"].wall),
        "eager_ops": int(med(ops["eager"].computing)),
        "graph_ops": int(med(ops["graph"].computing)),
        "steps": len(clocks["eager"].cpu),
        "rounds": rounds,
        "layers": cfg.num_layers,
        "threads": torch.get_num_threads(),
        "kept_tokens": int(eager_pol.cache.tokens_per_row()[0]),
        "live_tokens": HOST_QUERY + gen,
    }
    out["forward_cpu_s"] = out["eager_cpu_s"] - out["graph_cpu_s"]
    return out


def host_report(m: dict, gpu_s: float, *, command: str, machine: str, load: str = "") -> str:
    """The Markdown report of :func:`measure_host_step` against the predicted GPU time ``gpu_s`` of one step.

    Rows: measured host time of the eager step and of the graph step (thread CPU and wall, ms), the
    assumed replay call, the graph step's total; each compared with ``gpu_s`` (host below GPU: the GPU
    never waits on the host). Raises nothing."""
    eager, graph = m["eager_cpu_s"], m["graph_cpu_s"] + REPLAY_HOST_S
    ms = lambda s: f"{s * 1e3:.3f}"  # noqa: E731
    below = lambda s: "yes" if s < gpu_s else "**no**"  # noqa: E731

    def range_below(lo, hi):
        return "yes" if hi < gpu_s else "**no**" if lo >= gpu_s else "**not surely** (range spans it)"

    lines = [
        "# Host time per denoising step at Dream-7B's layout vs its predicted H200 GPU time",
        "",
        f"Command: `{command}`  ",
        machine + ("  " if load else ""),
    ]
    if load:
        lines.append(load)
    lines += [
        "",
        f"Step measured: one prefilling denoising step of a model with Dream-v0-7B's layer and head layout "
        f"({m['layers']} layers, 28 query / 4 KV heads, GQA group 7) at tiny widths (hidden 28, D = 16, "
        f"SwiGLU 32, vocabulary 512; random fp32 weights), batch 1, live block {m['live_tokens']} tokens over "
        f"{m['kept_tokens']} cached tokens (prefix + 4 kept chunks), `maskgit_plus`, one token per step; "
        f"{m['threads']} torch thread(s); medians of {m['steps']} timed steps per mode ({m['rounds']} rounds, "
        "order alternated). At these widths a step's arithmetic is a few MFLOP: its time on this CPU is host work.",
        "",
        "| per denoising step | thread CPU ms | wall ms | computing aten ops | predicted H200 GPU ms "
        "| host below GPU? |",
        "|---|---:|---:|---:|---:|:---:|",
        f"| eager step (forward + unmasking + write-back), measured | {ms(m['eager_cpu_s'])} | {ms(m['eager_wall_s'])} "
        f"| {m['eager_ops']} | {ms(gpu_s)} | {below(eager)} |",
        f"| of which the forward (eager - graph), measured | {ms(m['forward_cpu_s'])} | "
        f"{ms(m['eager_wall_s'] - m['graph_wall_s'])} | {m['eager_ops'] - m['graph_ops']} | | |",
        f"| CUDA-graph step: host work outside the captured forward, measured | {ms(m['graph_cpu_s'])} "
        f"| {ms(m['graph_wall_s'])} | {m['graph_ops']} | | |",
        f"| + the replay call, assumed (not measurable without CUDA) | {ms(REPLAY_HOST_S)} | | 1 | | |",
        f"| CUDA-graph step, host total | {ms(graph)} | | | {ms(gpu_s)} | {below(graph)} |",
        f"| eager step on CUDA, launches alone: {m['eager_ops']} ops x {LAUNCH_HOST_S[0] * 1e6:.2f}-"
        f"{LAUNCH_HOST_S[1] * 1e6:.1f} us, predicted | {ms(m['eager_ops'] * LAUNCH_HOST_S[0])}-"
        f"{ms(m['eager_ops'] * LAUNCH_HOST_S[1])} | | | {ms(gpu_s)} | "
        f"{range_below(m['eager_ops'] * LAUNCH_HOST_S[0], m['eager_ops'] * LAUNCH_HOST_S[1])} |",
        "",
        "Measured: the host time of the step on this CPU (the eager forward's dispatch of every op of the "
        f"{m['layers']} layers, including split-S attention through the CPU path; unmasking and write-back). "
        "Ops counted: aten ops that compute (views and bare allocations left out); on CUDA the eager forward "
        "would launch about one kernel for each (plus 2 Triton launches per layer, whose launcher costs more "
        "host time than a CPU op; here the CPU path of split-S runs instead): not measured here.",
        "Predicted: the GPU time of the same step at Dream-v0-7B's full widths on an H200 in bf16 "
        f"(`predict_step_gpu_s`: the roofline of `predict_cell_s`, live block {QUERY_TOKENS} query + {GPU_GEN} "
        f"response tokens over {PREFIX_TOKENS} prefix + 4 x 1025 chunk tokens, weights at "
        f"{HBM_EFFICIENCY:.0%} of 4.8 TB/s, FLOPs at {MMA_EFFICIENCY:.0%} of 989 TFLOPS, no host term).",
        f"Assumed: {REPLAY_HOST_S * 1e6:.0f} us for the replay call (`torch.cuda.CUDAGraph.replay()`): "
        "published CPU costs of one graph launch are 3.5-8 us (CUDA.jl documentation, "
        "https://cuda.juliagpu.org/dev/usage/graphs/) and about 15 us per replay host and device together "
        "(a cudaGraphLaunch probe on CUDA 13.3, https://github.com/ahrefs/ocannl/issues/488); 20 us is above "
        "both. The predicted eager line counts one CUDA launch per aten op at the per-launch host cost of that "
        "probe (2.65 us enqueued, 6.4 us with its synchronisation share), Python and dispatch excluded: a "
        "lower bound of an eager step on CUDA.",
        "Not in the GPU prediction: the unmasking kernels of the step (a few elementwise passes over "
        "[B, 32, 152064] logits, tens of microseconds on an H200). The denoising step reads nothing from the "
        "device (`tests/test_sync_budget.py`), so a host that stays below the GPU time is hidden behind it.",
    ]
    verdict = (
        f"The eager step's host time ({ms(eager)} ms) is "
        + ("below" if eager < gpu_s else "**above**")
        + f" the predicted GPU time ({ms(gpu_s)} ms); the CUDA-graph step leaves {ms(graph)} ms on the host, "
        + ("below it" if graph < gpu_s else "**above it**")
        + "."
    )
    if eager >= gpu_s and graph < gpu_s:
        verdict += " Only the graph path keeps the GPU from waiting on the host."
    lines += ["", verdict]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    """Measure, write ``e2e_dream_shape_host.md`` to ``--out``, print it."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=28, help="layers (default 28, Dream-7B's; fewer for a quick check)")
    p.add_argument("--rounds", type=int, default=10, help="timed rounds per mode (default 10)")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: on a small shared box an OpenMP team waiting for a descheduled "
        "thread made steps 50x slower)",
    )
    p.add_argument("--out", default=str(REPO_ROOT / "runs" / "bench"), help="output folder (default: runs/bench/)")
    args = p.parse_args(argv)
    if args.layers < 1 or args.rounds < 1 or args.threads < 1:
        print("error: --layers, --rounds and --threads must be >= 1", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    m = measure_host_step(host_config(args.layers), rounds=args.rounds)
    gpu_s = predict_step_gpu_s(dream7b_config(), GPU_GEN, 1024, 4)
    load = "Load average (1, 5, 15 min) at the end: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())
    cmd = "python -m bench.speed.host_step" + (f" --layers {args.layers}" if args.layers != 28 else "")
    cmd += f" --rounds {args.rounds}" if args.rounds != 10 else ""
    text = host_report(m, gpu_s, command=cmd, machine=machine_line("cpu"), load=load)
    save_text(args.out, "e2e_dream_shape_host.md", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
