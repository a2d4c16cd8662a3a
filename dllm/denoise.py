"""The denoising loop shared by every cache policy (dense, prefix_cache, prefilling).

A response of ``gen_length`` mask tokens is filled block by block (LLaDA's
semi-autoregressive blocks; one block = Dream's whole-response schedule). Each
denoising step asks the policy for the response logits and lets the unmasking
rule (:mod:`dllm.unmasking`) reveal some masked positions of the current block.
Policies differ only in how they compute logits (what they recompute and what
they cache); the loop, the schedule and the RNG use are identical, so greedy
outputs of policies with exact caches are identical token for token.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch
from tqdm.auto import tqdm

from dllm.unmasking import LLADA_ALGS, UnmaskingConfig, llada_schedule, unmask_step


class DecodePolicy(Protocol):
    """How logits are computed each step. ``nfe`` counts model forwards."""

    nfe: int

    def start_block(self, resp: torch.Tensor, block: slice) -> None:
        """Called before the first step of each block (a policy may refresh its cache)."""

    def logits(self, resp: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, G, V]`` of all response positions given the current response ``[B, G]``."""


class PhaseTimer:
    """Wall-clock seconds per named phase; synchronises CUDA so GPU work is counted."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.seconds: dict[str, float] = {}

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def phase(self, name: str):
        timer = self

        class _Ctx:
            def __enter__(self):
                timer._sync()
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                timer._sync()
                timer.seconds[name] = timer.seconds.get(name, 0.0) + time.perf_counter() - self.t0

        return _Ctx()


def denoise(
    policy: DecodePolicy,
    resp: torch.Tensor,
    *,
    mask_id: int,
    block_length: int,
    steps_per_block: int,
    cfg: UnmaskingConfig,
    generator: torch.Generator | None = None,
    progress: bool = False,
) -> int:
    """Fill the masked positions of ``resp`` in place; returns the number of denoising steps run.

    Args:
        policy: logits provider (see :class:`DecodePolicy`).
        resp: ``[B, G]`` int64 response, initially all ``mask_id`` (modified in place).
        mask_id: the [MASK] token id.
        block_length: tokens per semi-autoregressive block (divides G).
        steps_per_block: step budget per block (upper bound for ``confidence_threshold``).
        cfg: unmasking rule.
        generator: RNG for sampling rules (seeded by the caller for reproducibility).
        progress: show a tqdm bar over denoising steps.

    A block ends early when it has no masks left (those steps would reveal nothing).
    """
    b, g = resp.shape
    n_blocks = g // block_length
    bar = tqdm(total=n_blocks * steps_per_block, desc="denoising", unit="step", disable=not progress, leave=False)
    steps_run = 0
    try:
        for blk_i in range(n_blocks):
            blk = slice(blk_i * block_length, (blk_i + 1) * block_length)
            policy.start_block(resp, blk)
            n_masked = (resp[:, blk] == mask_id).sum(dim=1).tolist()
            quotas = [llada_schedule(n, steps_per_block) for n in n_masked] if cfg.alg in LLADA_ALGS else None
            # confidence_threshold reveals >= 1 token per step, so block_length steps always suffice.
            budget = steps_per_block if cfg.fixed_steps else block_length
            for step in range(budget):
                cand = resp[:, blk] == mask_id  # [B, block]
                if not cand.any():
                    break
                logits = policy.logits(resp)[:, blk]  # [B, block, V]
                for row in range(b):
                    quota = quotas[row][step] if quotas is not None else None
                    tokens, reveal = unmask_step(
                        logits[row], cand[row], cfg, step, steps_per_block, quota=quota, generator=generator
                    )
                    view = resp[row, blk]
                    view[reveal] = tokens[reveal]
                steps_run += 1
                bar.update(1)
    finally:
        bar.close()
    return steps_run
