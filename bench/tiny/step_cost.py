"""What a GPU training step of ``bench.tiny.gpu_run`` costs the host, measured on this CPU.

    OMP_NUM_THREADS=1 python -m bench.tiny.step_cost --seconds 20

1. The batch pipeline: ``make_step_batch`` (draw, encode, mask; what one worker process does) on one core
   for ``--seconds`` of CPU time, at the run's token budget, over steps of the main stage: tokens per second per core.
2. The step's host work: the same ``train_step`` (forward, loss, backward, clipping, AdamW, device
   accumulator) on a model of the run's depth (``--layers``) but 16 wide, on a 2 x 32 batch, so the
   arithmetic is negligible and what is left is Python and operator dispatch: a floor for the host time
   of a step on any device (a CUDA launch adds a few microseconds per kernel on top).
3. FLOPs per step of the candidate sizes: 6 x parameters x tokens for the matmuls plus the attention
   scores and values (12 x layers x hidden x L per token, forward and backward), at each length bucket.
"""

from __future__ import annotations

import argparse
import time

import torch

from bench.tiny import gpu_run
from bench.tiny.train import _init_model

CANDIDATES = {  # name: (hidden, layers, heads, kv heads, intermediate)
    "bundled 256x4": (256, 4, 8, 2, 704),
    "320x6 (gpu_run default)": (320, 6, 10, 2, 896),
    "384x6": (384, 6, 6, 2, 1024),
    "384x7": (384, 7, 6, 2, 1024),
}


def arch(h, n, hq, hkv, f) -> dict:
    return {
        "hidden_size": h,
        "num_hidden_layers": n,
        "num_attention_heads": hq,
        "num_key_value_heads": hkv,
        "intermediate_size": f,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
    }


def step_flops(a: dict, vocab: int, tokens: int, length: int) -> float:
    """Training FLOPs of one step of ``tokens`` tokens in rows of ``length``: 6 N T for the weights plus
    12 x layers x hidden x length per token for attention (QK^T and PV, forward and backward)."""
    return 6 * gpu_run.n_params(a, vocab) * tokens + 12 * a["num_hidden_layers"] * a["hidden_size"] * length * tokens


def pipeline_rate(corpus: str, seconds: float, budget: int, steps: int) -> dict:
    """``make_step_batch`` in this process (one core) over the main stage's steps for ``seconds`` of CPU time:
    batch tokens (rows x length, padding included) per CPU second and per wall second, the share of
    real (non-padding) tokens, and the batches drawn. CPU time is the per-core figure on a shared machine."""
    gpu_run.init_worker(corpus)
    first = int(gpu_run.STAGES[1].start * steps) + 1
    w0, c0, tokens, real, n = time.perf_counter(), time.process_time(), 0, 0, 0
    while time.process_time() - c0 < seconds:
        b = gpu_run.make_step_batch(0, first + n, steps, budget, 1536)
        tokens += b["inputs"].size
        real += int((b["segments"] >= 0).sum())
        n += 1
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    return {"cpu": tokens / cpu, "wall": tokens / wall, "real": real / tokens, "batches": n}


def host_step_ms(layers: int, reps: int) -> float:
    """Median CPU milliseconds of one ``train_step`` of a 16-wide model with ``layers`` layers on a 2 x 32 batch."""
    vocab = 100
    model = _init_model(vocab, arch(16, layers, 2, 1, 32))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    acc = torch.zeros(5)
    nb = {
        "inputs": torch.randint(4, vocab, (2, 32), dtype=torch.uint8).numpy(),
        "targets": torch.randint(4, vocab, (2, 32), dtype=torch.uint8).numpy(),
        "weights": torch.full((2, 32), 1 / 32).numpy(),
        "segments": torch.zeros(2, 32, dtype=torch.int8).numpy(),
    }
    times = []
    for _ in range(reps):
        t0 = time.process_time()  # CPU time of this process (one thread): robust to other jobs on the cores
        gpu_run.train_step(model, opt, gpu_run.to_device(nb, torch.device("cpu")), vocab, 1e-3, False, acc)
        times.append(time.process_time() - t0)
    return 1e3 * sorted(times)[len(times) // 2]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default="bench/tiny/corpus_build")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--token-budget", type=int, default=65536)
    p.add_argument("--steps", type=int, default=6000)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    r = pipeline_rate(a.corpus, a.seconds, a.token_budget, a.steps)
    print(
        f"pipeline: {r['cpu']:,.0f} batch tokens per CPU second on one core ({r['wall']:,.0f} per wall second here; "
        f"{r['batches']} batches of {a.token_budget} tokens, {100 * r['real']:.0f}% not padding); "
        f"16 cores: {16 * r['cpu'] / 1e6:.1f} M tokens/s"
    )
    for layers in (4, 6, 7):
        print(f"host work of a step, {layers} layers, 16 wide, 2 x 32 tokens: {host_step_ms(layers, 40):.1f} ms")
    for name, c in CANDIDATES.items():
        a_ = arch(*c)
        n = gpu_run.n_params(a_, 100)
        per = {L: step_flops(a_, 100, a.token_budget, L) / 1e12 for L in (256, 768, 1536)}
        print(
            f"{name}: {n / 1e6:.2f} M params; TFLOP per {a.token_budget}-token step at L=256/768/1536: "
            + " / ".join(f"{v:.2f}" for v in per.values())
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
