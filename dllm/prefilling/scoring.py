"""Predictive chunk scoring and intra-chunk token scores (Prefilling-dLLM, arXiv 2606.10537).

A chunk is relevant when it *predicts* the question and a draft of the answer:

- Pseudo-labels: a preliminary diffusion pass over ``prefix + query + m masks``
  (no context) proposes a draft answer; its confident slots are confirmed.
- ``s_I`` (self-information): mean log-probability of the query-window tokens
  given the chunk alone.
- ``s_P`` (pseudo-label): mean log-probability of the confirmed pseudo-labels given
  the chunk and the query.
- ``s = s_I + s_P``; the top-K chunks are kept.

``score_mode="dllm"`` computes log-probs the diffusion way: the scored tokens are
masked and predicted bidirectionally (two batched passes, one per term).
``score_mode="causal"`` is the reference code's variant for AR-initialised models with
shifted logits: next-token log-probs under a causal mask over the scoring tokens.

With independent chunk caches a pass costs only the scoring tokens' forward against
each chunk's cached K/V (a batch of N rows, one segment each). The same pass
accumulates, per layer, the attention mass each chunk token receives from the scoring
tokens (``triton_kernels.chunk_attention_scores``): the intra-chunk token scores.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import triton_kernels
from dllm.kv_cache import StaticKVCache
from dllm.prefilling.chunks import ChunkCache


@dataclass
class ChunkScores:
    """Scores of every chunk.

    A term that was not computed (not needed by the configured terms) is None, never a tensor of zeros.

    Attributes:
        self_info: ``[N]`` fp32, s_I (mean log-prob, <= 0).
        pseudo_label: ``[N]`` fp32, s_P.
        answer_confidence: ``[N]`` fp32, s_C: mean over the m draft slots of the log of the top-1
            probability given chunk + query (how sure the model is of *some* answer; our variant,
            from the probe of DESIGN section 6: it needs no draft to be right).
        draft_contrast: ``[N]`` fp32 (property), s_C - s_P: sure of *some* answer and unlike the
            context-free draft (our variant: a chunk that holds the answer overrides the guessed draft,
            while an irrelevant chunk leaves the model answering the draft).
        total: ``[N]`` fp32, the sum of the configured terms (higher = more relevant).
        token_scores: per layer ``[N, Hkv, T]`` fp32 attention mass per chunk token, or None.
    """

    self_info: torch.Tensor | None
    pseudo_label: torch.Tensor | None
    answer_confidence: torch.Tensor | None
    total: torch.Tensor
    token_scores: list | None = None

    @property
    def draft_contrast(self) -> torch.Tensor | None:
        if self.answer_confidence is None or self.pseudo_label is None:
            return None
        return self.answer_confidence - self.pseudo_label


def draft_pseudo_labels(model, prefix: torch.Tensor, query: torch.Tensor, m: int, threshold: float):
    """Draft answer without context: one denoising step over ``prefix + query + m masks``.

    Returns:
        (labels ``[m]`` int64 argmax tokens, confirmed ``[m]`` bool): a slot is confirmed when
        its top-1 probability is >= ``threshold``; the most confident slot always is.
    """
    masks = torch.full((m,), model.mask_token_id, dtype=torch.long, device=query.device)
    ids = torch.cat([prefix, query, masks])
    out = model(ids[None], torch.arange(ids.numel(), device=ids.device), logits_start=ids.numel() - m)
    probs = torch.softmax(out.logits[0].float(), dim=-1)  # [m, V]
    conf, labels = probs.max(dim=-1)
    confirmed = conf >= threshold
    confirmed[conf.argmax()] = True
    return labels, confirmed


def _mean_logprob(logits: torch.Tensor, targets: torch.Tensor, select: torch.Tensor) -> torch.Tensor:
    """Mean over selected columns of log p(target): logits [N, M, V], targets [M], select [M] bool -> [N]."""
    if not bool(select.any()):
        return torch.zeros(logits.shape[0], dtype=torch.float32, device=logits.device)
    lp = torch.log_softmax(logits[:, select].float(), dim=-1)  # [N, S, V]
    tgt = targets[select][None, :, None].expand(lp.shape[0], -1, 1)
    return lp.gather(-1, tgt).squeeze(-1).mean(dim=1)


def _top1_logprob(logits: torch.Tensor) -> torch.Tensor:
    """Mean over slots of log max_v p(v): logits [N, m, V] -> [N]."""
    return torch.log_softmax(logits.float(), dim=-1).max(dim=-1).values.mean(dim=1)


def _chunk_rows_cache(chunks: ChunkCache, lo: int, hi: int) -> StaticKVCache:
    n = hi - lo
    dev = chunks.lens.device
    return StaticKVCache(
        [k[lo:hi] for k in chunks.k],
        [v[lo:hi] for v in chunks.v],
        torch.arange(n, dtype=torch.int32, device=dev)[:, None],
        chunks.lens[lo:hi, None].clone(),
    )


def _cached_pass(model, chunks, live: torch.Tensor, lo: int, hi: int, token_acc=None):
    """Scoring tokens ``live [M]`` against chunks lo..hi: logits ``[n, M, V]``."""
    m = live.numel()
    pos = chunks.lens[lo:hi, None].long() + torch.arange(m, device=live.device)[None]
    hook = None
    if token_acc is not None:

        def hook(layer, q, k, v):
            mass, _extra, _lse = triton_kernels.chunk_attention_scores(
                q, chunks.k[layer][lo:hi], chunks.lens[lo:hi], k_extra=k
            )
            token_acc[layer][lo:hi] += mass

    out = model(live[None].expand(hi - lo, m), pos, _chunk_rows_cache(chunks, lo, hi), attn_hook=hook)
    return out.logits


def _causal_pass(model, chunks, live: torch.Tensor, lo: int, hi: int):
    """Dense forward of ``[BOS chunk] + live`` per chunk with a causal mask over the live tokens."""
    n, t = hi - lo, chunks.k[0].shape[1]
    m = live.numel()
    dev = live.device
    raise_if_unshifted(model)
    # Re-encode the chunk rows: the cache holds K/V, not token ids, so we rebuild ids from the context.
    ids = torch.cat([chunks.ids[lo:hi], live[None].expand(n, m)], dim=1)  # [n, T + M]
    lens = chunks.lens[lo:hi].long()
    pos = torch.cat([torch.arange(t, device=dev).expand(n, t), lens[:, None] + torch.arange(m, device=dev)], dim=1)
    key = torch.arange(t + m, device=dev)
    valid = torch.cat([key[None, :t] < lens[:, None], torch.ones(n, m, dtype=torch.bool, device=dev)], dim=1)
    is_live = key >= t
    chunk_rows = ~is_live[:, None] & ~is_live[None, :]  # chunk -> chunk (same chunk: one row per chunk)
    live_rows = is_live[:, None] & (~is_live[None, :] | (key[None, :] <= key[:, None]))
    allowed = (chunk_rows | live_rows)[None] & valid[:, None, :]
    out = model(ids, pos, attention_mask=allowed, logits_start=t)
    return out.logits


def raise_if_unshifted(model):
    if not model.shift_logits:
        raise ValueError("score_mode='causal' needs a model with shifted (next-token) logits, e.g. the Dream family")


def score_chunks(
    model,
    chunks: ChunkCache,
    query: torch.Tensor,
    labels: torch.Tensor,
    confirmed: torch.Tensor,
    *,
    mode: str = "dllm",
    terms=("self_info", "pseudo_label"),
    token_scores: bool = False,
    batch: int | None = None,
):
    """Score every chunk; optionally accumulate per-layer token scores.

    Args:
        model: the dLLM.
        chunks: the chunked-prefill cache (``chunks.ids`` needed for ``causal`` mode).
        query: ``[Mq]`` the query-window tokens (scoring tokens).
        labels, confirmed: ``[m]`` draft tokens and which are confirmed pseudo-labels.
        mode: ``dllm`` or ``causal``.
        terms: score terms summed into ``total``.
        token_scores: also return the per-layer query->chunk attention mass ``[N, Hkv, T]``.
        batch: chunks per forward (None = all).

    Returns:
        (:class:`ChunkScores`, number of model forwards). ``causal`` mode computes every term;
        ``dllm`` mode s_I only for ``self_info`` and s_P, s_C only for the other terms or
        ``token_scores`` (the rest are None).
    """
    n = chunks.num_chunks
    step = batch or n
    mq, m = query.numel(), labels.numel()
    mask_id = model.mask_token_id
    dev = query.device
    s_i = torch.zeros(n, dtype=torch.float32, device=dev)
    s_p = torch.zeros(n, dtype=torch.float32, device=dev)
    s_c = torch.zeros(n, dtype=torch.float32, device=dev)
    cfg = model.config
    acc = None
    if token_scores:
        acc = [
            torch.zeros(n, cfg.num_kv_heads, chunks.k[0].shape[1], dtype=torch.float32, device=dev)
            for _ in range(cfg.num_layers)
        ]
    masks = torch.full((m,), mask_id, dtype=torch.long, device=dev)
    q_sel = torch.ones(mq, dtype=torch.bool, device=dev)
    if model.shift_logits:  # the first live token has no live predecessor to predict it from
        q_sel[0] = False
    causal = mode == "causal"  # one pass gives every term
    need_i = causal or "self_info" in terms
    need_pc = causal or bool({"pseudo_label", "answer_confidence", "draft_contrast"} & set(terms)) or token_scores
    nfe = 0
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        if causal:
            # next-token log-probs: query tokens and confirmed labels both visible, causal order
            live = torch.cat([query, torch.where(confirmed, labels, masks)])
            logits = _causal_pass(model, chunks, live, lo, hi)
            nfe += 1
            # token 0 would be predicted from the last chunk row, which is padding in a short last chunk
            s_i[lo:hi] = _mean_logprob(logits[:, :mq], query, q_sel)
            s_p[lo:hi] = _mean_logprob(logits[:, mq:], labels, confirmed)
            s_c[lo:hi] = _top1_logprob(logits[:, mq:])
            if token_scores:
                _cached_pass(model, chunks, torch.cat([query, masks]), lo, hi, acc)
                nfe += 1
            continue
        if need_i:
            live_i = torch.full((mq + m,), mask_id, dtype=torch.long, device=dev)
            logits = _cached_pass(model, chunks, live_i, lo, hi)
            nfe += 1
            s_i[lo:hi] = _mean_logprob(logits[:, :mq], query, q_sel)
        if need_pc:
            logits = _cached_pass(model, chunks, torch.cat([query, masks]), lo, hi, acc)
            nfe += 1
            s_p[lo:hi] = _mean_logprob(logits[:, mq:], labels, confirmed)
            s_c[lo:hi] = _top1_logprob(logits[:, mq:])
    scores = ChunkScores(
        s_i if need_i else None,
        s_p if need_pc else None,
        s_c if need_pc else None,
        total=torch.zeros_like(s_i),
        token_scores=acc,
    )
    scores.total = sum(getattr(scores, t) for t in terms)  # term names are the attribute names
    return scores, nfe
