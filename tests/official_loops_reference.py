"""The official sampling loops, re-stated from their published descriptions, as the reference of
``draw_order="official"`` (:mod:`dllm.decode.unmasking`). Test code only; the package never imports it.

What is re-stated (facts of ``Dream-org/Dream`` ``generation_utils.py``, ``ML-GSAI/LLaDA`` ``generate.py`` and
``NVlabs/Fast-dLLM`` ``generate.py``; the code is ours):

- Dream ``_sample``: one block over the whole response; every step gathers the masked positions of the whole
  batch row by row (``x[mask_index]``). ``origin``: one ``torch.rand`` per masked position against
  ``1 - s/t`` of a float32 ``linspace(1, eps, steps + 1)`` (1 at the last step), then tokens for the moving
  positions only; the other rules: tokens for every masked position, then ``int(mean masks per row *
  (1 - s/t))`` positions (all float32 tensors: :func:`dream_transfer_count`) by one ``torch.topk`` of the
  confidence over the ``[B, prompt + response]`` rows (in the logits' dtype, -inf off the masks; ties go where
  ``torch.topk`` puts them), or with ``alg_temp`` by ``torch.multinomial`` (no replacement) of
  ``softmax(confidence / alg_temp)`` over those rows.
  Tokens (``sample_tokens``): logits / T, top-p then top-k filtering (filled with the dtype's minimum),
  softmax, ``Categorical(probs).sample()`` at T > 0, else (or when ``Categorical`` refuses the probs) the max.
- LLaDA ``generate``: semi-autoregressive blocks, ``steps / blocks`` steps each, all of them run; per step
  ``x0 = argmax(exp(logits) / (-log u) ** T)`` with ``u = torch.rand_like(logits, float64)`` over the
  whole sequence (T > 0), then confidence ``softmax(logits)[x0]`` (``low_confidence``) or ``torch.rand`` of
  ``[B, L]`` (``random``); -inf after the block and off the masks; per row ``torch.topk`` of the step's quota
  (``mask_num // steps``, the remainder to the first steps) over that row of the whole sequence.
- Fast-dLLM ``generate`` with a threshold (no cache): LLaDA's tokens, confidence from a float64 softmax,
  per row the first of ``torch.topk`` over all the block's masks (the row of the whole sequence) plus every
  other one >= the threshold, until the block has no mask.

Every loop runs on the global RNG: call ``torch.manual_seed(seed)`` first. The one addition, as in
``tests/unmasking_reference.py``: the mask token's logit is set to -inf (the package never chooses it).
``logits_of(x)`` returns ``[B, L, V]`` float logits of every position of ``x``, aligned (Dream's shift done).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _dream_filters(logits, top_p, top_k):
    low = torch.finfo(logits.dtype).min
    if top_p is not None and top_p < 1:
        desc, order = torch.sort(logits, descending=True)
        over = torch.cumsum(F.softmax(desc, dim=-1), dim=-1) > top_p
        over[..., 1:] = over[..., :-1].clone()
        over[..., 0] = False
        logits = logits.masked_fill(torch.zeros_like(over).scatter(-1, order, over), low)
    if top_k is not None:
        top_k = min(top_k, logits.shape[-1])
        logits = logits.masked_fill(logits < torch.topk(logits, top_k).values[..., -1:], low)
    return logits


def _dream_tokens(logits, alg, temperature, top_p, top_k):
    """(confidence, tokens) of ``sample_tokens``."""
    if temperature > 0:
        logits = logits / temperature
    probs = torch.softmax(_dream_filters(logits, top_p, top_k), dim=-1)
    try:  # Dream falls back to the max when Categorical refuses the probs (its simplex check)
        if not temperature > 0:
            raise ValueError("greedy")
        # validate_args=True: the default of a plain process, where Dream's loop runs; torch.compile (used by other
        # tests in this process) turns the global default off, which would skip the check Dream relies on
        x0 = torch.distributions.Categorical(probs=probs, validate_args=True).sample()
        conf = probs.gather(-1, x0[:, None]).squeeze(-1)
    except ValueError:
        conf, x0 = probs.max(dim=-1)
    if alg == "topk_margin":
        top = torch.sort(probs, dim=-1, descending=True).values
        conf = top[:, 0] - top[:, 1]
    elif alg == "entropy":
        conf = (probs * torch.log(probs + 1e-10)).sum(dim=-1)
    return conf, x0


def dream_transfer_count(masked, ts, i, steps):
    """Dream's ``number_transfer_tokens`` at step ``i``: the masks per row ``masked.sum() / B`` (a float32 tensor),
    times ``1 - s / t`` of the float32 ``ts = torch.linspace(1, eps, steps + 1)`` (0-dim float32 tensors), made an
    int; at the last step every mask."""
    per_row = masked.sum() / masked.shape[0]
    t, s = ts[i], ts[i + 1]
    return int(per_row * (1 - s / t)) if i < steps - 1 else int(per_row)


def dream_official(logits_of, prompt, gen_length, steps, alg, mask_id, *, temperature=0.0, top_p=None, top_k=None,
                   alg_temp=None, eps=1e-3):  # fmt: skip
    """Dream's loop; returns the response ``[B, gen_length]``."""
    b, lp = prompt.shape
    x = torch.cat([prompt, torch.full((b, gen_length), mask_id, dtype=torch.long)], dim=1)
    ts = torch.linspace(1, eps, steps + 1)
    for i in range(steps):
        masked = x == mask_id
        logits = logits_of(x)
        logits[..., mask_id] = float("-inf")
        ml = logits[masked]
        t, s = ts[i], ts[i + 1]
        if alg == "origin":
            p = 1 - s / t if i < steps - 1 else 1
            new = torch.full((ml.shape[0],), mask_id, dtype=torch.long)
            move = torch.rand(ml.shape[0]) < p
            if move.any():
                new[move] = _dream_tokens(ml[move], alg, temperature, top_p, top_k)[1]
            x[masked] = new
            continue
        conf, x0 = _dream_tokens(ml, alg, temperature, top_p, top_k)
        n = dream_transfer_count(masked, ts, i, steps)
        full = torch.full(x.shape, float("-inf"), dtype=logits.dtype)
        full[masked] = conf
        if n <= 0:
            continue
        if alg_temp:
            pos = torch.multinomial(F.softmax(full / alg_temp, dim=-1), num_samples=n)
        else:
            pos = torch.topk(full, n).indices
        cand = torch.full_like(x, mask_id)
        cand[masked] = x0
        rows = torch.arange(b)[:, None].expand_as(pos)
        x[rows, pos] = cand[rows, pos]
    return x[:, lp:]


def llada_official(logits_of, prompt, gen_length, steps, block_length, mask_id, *, temperature=0.0,
                   remasking="low_confidence", threshold=None):  # fmt: skip
    """LLaDA's loop (``threshold``: Fast-dLLM's parallel decoding instead of the quotas); returns the response."""
    b, lp = prompt.shape
    x = torch.cat([prompt, torch.full((b, gen_length), mask_id, dtype=torch.long)], dim=1)
    n_blocks = gen_length // block_length
    per_block = steps // n_blocks
    for blk in range(n_blocks):
        lo, hi = lp + blk * block_length, lp + (blk + 1) * block_length
        in_block = (x[:, lo:hi] == mask_id).sum(dim=1)
        quotas = [
            [int(m) // per_block + (1 if i < int(m) % per_block else 0) for i in range(per_block)] for m in in_block
        ]
        i = 0
        while (threshold is None and i < per_block) or (threshold is not None and (x[:, lo:hi] == mask_id).any()):
            masked = x == mask_id
            logits = logits_of(x)
            logits[..., mask_id] = float("-inf")
            if temperature > 0:
                u = torch.rand_like(logits, dtype=torch.float64)
                x0 = (logits.to(torch.float64).exp() / (-torch.log(u)) ** temperature).argmax(dim=-1)
            else:
                x0 = logits.argmax(dim=-1)
            if remasking == "random":
                conf = torch.rand(x0.shape)
            else:
                p = F.softmax(logits.to(torch.float64) if threshold is not None else logits, dim=-1)
                conf = p.gather(-1, x0[..., None]).squeeze(-1)
            masked[:, hi:] = False
            conf = torch.where(masked, conf, torch.tensor(float("-inf"), dtype=conf.dtype))
            x0 = torch.where(masked, x0, x)
            take = torch.zeros_like(masked)
            for row in range(b):
                k = int(masked[row].sum()) if threshold is not None else quotas[row][i]
                top = torch.topk(conf[row], k=k)
                take[row, top.indices] = True
                if threshold is not None:
                    take[row, top.indices[1:][top.values[1:] < threshold]] = False
            x[take] = x0[take]
            i += 1
    return x[:, lp:]
