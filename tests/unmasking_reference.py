"""The per-row unmasking step as first written (main at 4249ab5, ``dllm.decode.unmasking.unmask_step``), kept as
the reference of the batched :func:`dllm.decode.unmasking.unmask_batch`: gather the row's candidates, choose
tokens, rank, pick. Only the mask token's exclusion is added (its logit set to -inf, as the batched
step does), so greedy choices must agree exactly. Test code only; the package never imports it.
"""

from __future__ import annotations

import torch

from dllm.decode.unmasking import DREAM_ALGS, LLADA_ALGS, _filter_logits, dream_count, llada_schedule, most_confident


def _choose_tokens(logits, cfg, generator=None):
    logits = logits.float()
    tempered = logits / cfg.temperature if cfg.temperature > 0 else logits
    filtered = _filter_logits(tempered, cfg.top_p, cfg.top_k)
    probs = torch.softmax(filtered, dim=-1)
    if cfg.temperature > 0:
        x0 = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    else:
        x0 = probs.argmax(dim=-1)
    if cfg.confidence_from == "logits" and filtered is not logits:
        probs = torch.softmax(logits, dim=-1)
    return x0, probs


def _confidence_of(alg, probs, x0, generator=None):
    if alg == "topk_margin":
        top2 = torch.topk(probs, min(2, probs.shape[-1]), dim=-1).values
        return top2[:, 0] - (top2[:, 1] if top2.shape[1] > 1 else 0)
    if alg == "entropy":
        return (probs * torch.log(probs + 1e-10)).sum(dim=-1)
    if alg == "random":
        return torch.rand(x0.shape, generator=generator, device=x0.device)
    return probs.gather(-1, x0[:, None]).squeeze(-1)


def unmask_step(logits, candidates, cfg, step, steps, quota=None, generator=None, mask_id=None):
    """One row: ``logits [L, V]``, ``candidates [L]`` bool -> (tokens ``[L]``, reveal ``[L]``)."""
    if mask_id is not None:
        logits = logits.float().clone()
        logits[:, mask_id] = float("-inf")
    L = candidates.shape[0]
    reveal = torch.zeros(L, dtype=torch.bool, device=candidates.device)
    tokens = torch.zeros(L, dtype=torch.long, device=candidates.device)
    idx = candidates.nonzero().squeeze(-1)
    n = idx.numel()
    if n == 0:
        return tokens, reveal
    x0, probs = _choose_tokens(logits[idx], cfg, generator)
    tokens[idx] = x0
    if cfg.alg == "origin":
        t = 1 - step * (1 - cfg.eps) / steps
        s = 1 - (step + 1) * (1 - cfg.eps) / steps
        p = 1.0 if step >= steps - 1 else 1 - s / t
        pick = torch.rand(n, generator=generator, device=idx.device) < p
        reveal[idx[pick]] = True
        return tokens, reveal
    conf = _confidence_of(cfg.alg, probs, x0, generator)
    if cfg.alg == "confidence_threshold":
        pick = conf >= cfg.threshold
        pick[conf.argmax()] = True
        reveal[idx[pick]] = True
        return tokens, reveal
    k = quota if cfg.alg in LLADA_ALGS else dream_count(n, step, steps, cfg.eps)
    k = min(int(k), n)
    if k <= 0:
        return tokens, reveal
    if cfg.alg in DREAM_ALGS and cfg.alg_temp:
        w = torch.softmax(conf / cfg.alg_temp, dim=-1)
        chosen = torch.multinomial(w, k, replacement=False, generator=generator)
    else:
        chosen = most_confident(conf, k)
    reveal[idx[chosen]] = True
    return tokens, reveal


def reference_denoise(policy, resp, mask_id, block_length, steps_per_block, cfg, generator=None, mask_free=True):
    """main's loop, row by row, with an early-exit check every step and boolean-mask write-back.

    Returns (steps run, per-row steps). ``mask_free=False`` runs main exactly (the mask id may be chosen).
    """
    batch, n = resp.shape
    steps_run, row_steps = 0, [0] * batch
    for blk_i in range(n // block_length):
        blk = slice(blk_i * block_length, (blk_i + 1) * block_length)
        n_masked = (resp[:, blk] == mask_id).sum(dim=1).tolist()
        quotas = [llada_schedule(m, steps_per_block) for m in n_masked] if cfg.alg in LLADA_ALGS else None
        for step in range(steps_per_block if cfg.fixed_steps else block_length):
            cand = resp[:, blk] == mask_id
            if not cand.any():
                break
            policy.prepare(resp, blk, step)
            logits = policy.logits(resp)[:, blk]
            for row in range(batch):
                quota = quotas[row][step] if quotas is not None else None
                tokens, reveal = unmask_step(
                    logits[row], cand[row], cfg, step, steps_per_block, quota, generator, mask_id if mask_free else None
                )
                view = resp[row, blk]
                view[reveal] = tokens[reveal]
                row_steps[row] += bool(cand[row].any())
            steps_run += 1
    return steps_run, row_steps
