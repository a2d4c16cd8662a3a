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
from dllm.unmasking import LLADA_ALGS, UnmaskingConfig, dream_count, llada_schedule, unmask_step


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
    row_steps: list | None = None,
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
        row_steps: if given, a list that receives B ints: the steps in which each row still had a
            masked position in the current block (what that row decoded alone would run).

    A block ends early when it has no masks left (those steps would reveal nothing). Checking that
    costs a device-to-host copy, so for the rules with a fixed reveal count (all but ``origin`` and
    ``confidence_threshold``) the loop only checks once the schedule says every row may be done: each
    row's masks left are at least the schedule's count (a step reveals at most its count, fewer only
    when a chosen token is the mask id itself), so while that count is positive the check would pass.
    """
    timer = timer or PhaseTimer(resp.device)
    batch, gen_length = resp.shape
    n_blocks = gen_length // block_length
    bar = tqdm(total=n_blocks * steps_per_block, desc="denoising", unit="step", disable=not progress, leave=False)
    steps_run = 0
    active = torch.zeros(batch, dtype=torch.long, device=resp.device)  # steps per row, read once at the end
    try:
        for blk_i in range(n_blocks):
            blk = slice(blk_i * block_length, (blk_i + 1) * block_length)
            n_masked = (resp[:, blk] == mask_id).sum(dim=1).tolist()
            quotas = [llada_schedule(n, steps_per_block) for n in n_masked] if cfg.alg in LLADA_ALGS else None
            # a lower bound of each row's masks left, from the schedule (None: the count is random or model-made)
            left = list(n_masked) if cfg.fixed_steps and cfg.alg != "origin" else None
            # confidence_threshold reveals >= 1 token per step, so block_length steps always suffice.
            budget = steps_per_block if cfg.fixed_steps else block_length
            for step in range(budget):
                cand = resp[:, blk] == mask_id  # [B, block]
                if (left is None or not any(left)) and not cand.any():
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
                        view.copy_(torch.where(reveal, tokens, view))  # no boolean indexing: no host sync
                active += cand.any(dim=1)
                if left is not None:
                    left = [
                        n - scheduled_reveals(cfg, n, step, steps_per_block, quotas, row) for row, n in enumerate(left)
                    ]
                steps_run += 1
                bar.update(1)
    finally:
        bar.close()
    if row_steps is not None:
        row_steps.extend(active.tolist())
    return steps_run


def scheduled_reveals(cfg: UnmaskingConfig, n_left: int, step: int, steps: int, quotas, row: int) -> int:
    """Positions a fixed-count rule reveals at ``step`` when ``n_left`` masks are left: LLaDA's quota
    (:func:`~dllm.unmasking.llada_schedule`) or Dream's count (:func:`~dllm.unmasking.dream_count`),
    at most ``n_left`` (what :func:`~dllm.unmasking.unmask_step` asks for)."""
    k = quotas[row][step] if cfg.alg in LLADA_ALGS else dream_count(n_left, step, steps, cfg.eps)
    return min(int(k), n_left)
