"""The denoising loop shared by every cache policy (dense, prefix_cache, prefilling).

A response of ``gen_length`` mask tokens is filled block by block (LLaDA's
semi-autoregressive blocks; one block = Dream's whole-response schedule). Each
denoising step asks the policy (:mod:`dllm.policies`) for the response logits and
lets the unmasking rule (:mod:`dllm.unmasking`) reveal some masked positions of the
current block. Policies differ only in how they compute logits (what they recompute
and what they cache); the loop, the schedule and the RNG use are identical, so greedy
outputs of policies with exact caches are identical token for token.
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from dllm.policies import DecodePolicy
from dllm.timer import PhaseTimer
from dllm.unmasking import LLADA_ALGS, UnmaskingConfig, llada_schedule, unmask_step


def denoise(
    policy: DecodePolicy,
    resp: torch.Tensor,
    *,
    mask_id: int,
    block_length: int,
    steps_per_block: int,
    cfg: UnmaskingConfig,
    timer: PhaseTimer | None = None,
    generator: torch.Generator | None = None,
    progress: bool = False,
) -> int:
    """Fill the masked positions of ``resp`` in place; returns the number of denoising steps run.

    Args:
        policy: logits provider (see :class:`dllm.policies.DecodePolicy`).
        resp: ``[B, L_d]`` int64 response, initially all ``mask_id`` (modified in place).
        mask_id: the [MASK] token id.
        block_length: tokens per semi-autoregressive block (divides L_d).
        steps_per_block: step budget per block (upper bound for ``confidence_threshold``).
        cfg: unmasking rule.
        timer: adds each step (logits + unmasking) to its ``decode`` phase (None = untimed).
        generator: RNG for sampling rules (seeded by the caller for reproducibility).
        progress: show a tqdm bar over denoising steps.

    A block ends early when it has no masks left (those steps would reveal nothing).
    """
    timer = timer or PhaseTimer(resp.device)
    batch, gen_length = resp.shape
    n_blocks = gen_length // block_length
    bar = tqdm(total=n_blocks * steps_per_block, desc="denoising", unit="step", disable=not progress, leave=False)
    steps_run = 0
    try:
        for blk_i in range(n_blocks):
            blk = slice(blk_i * block_length, (blk_i + 1) * block_length)
            n_masked = (resp[:, blk] == mask_id).sum(dim=1).tolist()
            quotas = [llada_schedule(n, steps_per_block) for n in n_masked] if cfg.alg in LLADA_ALGS else None
            # confidence_threshold reveals >= 1 token per step, so block_length steps always suffice.
            budget = steps_per_block if cfg.fixed_steps else block_length
            for step in range(budget):
                cand = resp[:, blk] == mask_id  # [B, block]
                if not cand.any():
                    break
                policy.prepare(resp, blk, step)
                with timer.phase("decode"):
                    logits = policy.logits(resp)[:, blk]  # [B, block, V]
                    for row in range(batch):
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
