"""The denoising loop shared by every cache policy (dense, prefix_cache, prefilling).

A response of ``gen_length`` mask tokens is filled block by block (LLaDA's
semi-autoregressive blocks; one block = Dream's whole-response schedule). Each
denoising step asks the policy (:mod:`dllm.decode.policies`) for the response logits and
lets the unmasking rule (:mod:`dllm.decode.unmasking`) reveal some masked positions of the
current block. Policies differ only in how they compute logits (what they recompute
and what they cache); the loop, the schedule and the RNG use are identical, so greedy
outputs of policies with exact caches are identical token for token.

Host reads (the sync budget, enforced by ``tests/test_sync_budget.py``): a denoising step (the
policy's forward, the batched unmasking :func:`dllm.decode.unmasking.unmask_batch` and the write-back) reads
nothing from the device. Between steps the loop reads:

- nothing, for the rules with a fixed reveal count (Dream's ``maskgit_plus``, ``topk_margin``,
  ``entropy``; LLaDA's ``low_confidence``, ``random``): their schedule says on the host when a block
  is done (a block starts all masked, and the mask token is never chosen);
- one scalar before each step after a block's first, for ``origin`` and ``confidence_threshold``
  (model-made or random counts): "any mask left in the block?", to stop the block early;
- one scalar at the end of each block: the first step with a NaN distribution at a candidate
  position (raised as a ``ValueError`` naming step, row and position; a NaN never becomes a token);
- before the loop, whether ``resp`` is all masks; after it, the per-row step counts (``row_steps``).

That budget is the default draw order's; the opt-in ``draw_order="official"`` (the official loops' draws,
:mod:`dllm.decode.unmasking`) gathers a step's candidates by boolean indexing and reads the per-row counts its
``torch.topk`` calls take: a few more reads per step.
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from dllm.decode.policies import DecodePolicy
from dllm.decode.timer import PhaseTimer
from dllm.decode.unmasking import LLADA_ALGS, UnmaskingConfig, unmask_batch


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
    seq_start: int = 0,
) -> int:
    """Fill the masked positions of ``resp`` in place; returns the number of denoising steps run.

    Args:
        policy: logits provider (see :class:`dllm.decode.policies.DecodePolicy`).
        resp: ``[B, L_d]`` int64 response, all ``mask_id`` (modified in place).
        mask_id: the [MASK] token id (never written: its logit is excluded).
        block_length: tokens per semi-autoregressive block (divides L_d).
        steps_per_block: step budget per block (upper bound for ``confidence_threshold``).
        cfg: unmasking rule.
        timer: adds each step (logits + unmasking) to its ``decode`` phase (None = untimed).
        generator: RNG for sampling rules (seeded by the caller for reproducibility); one for the
            batch, draw order in :mod:`dllm.decode.unmasking`.
        progress: show a tqdm bar over denoising steps.
        row_steps: if given, a list that receives B ints: the steps in which each row still had a
            masked position in the current block (what that row decoded alone would run).
        seq_start: the response's first position in the sequence the official loops decode (the prompt
            length); read by ``cfg.draw_order == "official"`` only, whose draws cover that whole sequence.

    A block ends early when it has no masks left (those steps would reveal nothing): for LLaDA's
    rules after ``min(steps_per_block, block_length)`` steps (later quotas are 0), for ``origin``
    and ``confidence_threshold`` when a check between steps finds no mask (the host reads of the
    module docstring); Dream's fixed-count rules reveal the rest at their last step. With
    ``draw_order="official"`` LLaDA's rules run every step of the budget when they draw (temperature > 0,
    ``random``), as the official loop does (its draws shift the next block's), and each step reads the
    candidate count (boolean indexing of Dream's draws) and the reveal counts (``torch.topk``'s ``k``).

    Raises:
        ValueError: ``resp`` is not all ``mask_id``; a candidate position's distribution is NaN (a
            NaN or +inf logit, or no finite one), naming the step, row and position (checked at the
            end of each block).
    """
    timer = timer or PhaseTimer(resp.device)
    batch, gen_length = resp.shape
    if not bool((resp == mask_id).all()):
        raise ValueError(f"denoise needs a response of mask tokens only (mask id {mask_id})")
    n_blocks = gen_length // block_length
    bar = tqdm(total=n_blocks * steps_per_block, desc="denoising", unit="step", disable=not progress, leave=False)
    steps_run = 0
    active = torch.zeros(batch, dtype=torch.long, device=resp.device)  # steps per row, read once at the end
    # rules whose step count the host cannot know: one "masks left?" read between steps
    check_left = cfg.alg in ("origin", "confidence_threshold")
    # confidence_threshold reveals >= 1 token per step, so block_length steps always suffice; LLaDA's
    # quotas are 0 after block_length steps (n // steps = 0, the remainder to the first n).
    budget = steps_per_block if cfg.fixed_steps else block_length
    if cfg.alg in LLADA_ALGS and not (cfg.draw_order == "official" and cfg.draws):
        budget = min(budget, block_length)  # (the official loop draws at every step: the official order too)
    block_masks = torch.full((batch,), block_length, dtype=torch.long, device=resp.device)
    try:
        for blk_i in range(n_blocks):
            blk = slice(blk_i * block_length, (blk_i + 1) * block_length)
            view = resp[:, blk]
            nan_step = torch.full((batch, block_length), -1, dtype=torch.long, device=resp.device)
            for step in range(budget):
                cand = view == mask_id  # [B, block]
                if check_left and step > 0 and not bool(cand.any()):  # the one read between steps
                    break
                policy.prepare(resp, blk, step)
                with timer.phase("decode"):
                    logits = policy.logits(resp)  # [B, L_d, V], or the block's [B, block, V] only
                    if logits.shape[1] != block_length:
                        logits = logits[:, blk]
                    choice = unmask_batch(
                        logits,
                        cand,
                        cfg,
                        step,
                        steps_per_block,
                        block_masks=block_masks,
                        mask_id=mask_id,
                        generator=generator,
                        seq_span=(seq_start + blk.start, seq_start + gen_length),
                    )
                    view.copy_(torch.where(choice.reveal, choice.tokens, view))  # no boolean indexing: no sync
                    nan_step.masked_fill_(choice.invalid & (nan_step < 0), steps_run)
                active += cand.any(dim=1)
                steps_run += 1
                bar.update(1)
            _raise_on_nan(nan_step, blk_i * block_length)
    finally:
        bar.close()
    if row_steps is not None:
        row_steps.extend(active.tolist())
    return steps_run


def _raise_on_nan(nan_step: torch.Tensor, offset: int) -> None:
    """Raise when a step of the block met a NaN distribution (``nan_step [B, block]``: first step per
    position, -1 = none); one scalar read, the rest only on the error path."""
    if int(nan_step.max()) < 0:
        return
    first = nan_step.masked_fill(nan_step < 0, torch.iinfo(torch.long).max)
    step = int(first.min())
    row, pos = (first == step).nonzero()[0].tolist()
    raise ValueError(
        f"NaN logits at denoising step {step}, batch row {row}, response position {offset + pos}: "
        "the model's distribution there is NaN (a NaN or +inf logit, or no finite logit besides the mask token)"
    )
