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
from dllm.model.kv_cache import StaticKVCache
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
            it needs no draft to be right).
        draft_contrast: ``[N]`` fp32 (property), s_C - s_P: sure of *some* answer and unlike the
            context-free draft (our variant: a chunk that holds the answer overrides the guessed draft,
            while an irrelevant chunk leaves the model answering the draft).
        total: ``[N]`` fp32, the sum of the configured terms (higher = more relevant).
        token_scores: per layer ``[N, Hkv, T]`` fp32 attention mass per chunk token, or None.
        candidates: the chunks that were scored when a first stage chose them (ascending; the other
            chunks' terms and total are ``-inf``, their token scores 0), else None (every chunk scored).
        lexical: ``[N]`` fp32 lexical scores of every chunk when ``PrefillingConfig.lexical_weight`` fused them
            into ``total`` (:mod:`dllm.prefilling.lexical`), else None.
    """

    self_info: torch.Tensor | None
    pseudo_label: torch.Tensor | None
    answer_confidence: torch.Tensor | None
    total: torch.Tensor
    token_scores: list | None = None
    candidates: list | None = None
    lexical: torch.Tensor | None = None

    def scatter(self, candidates: list, n: int) -> ChunkScores:
        """These scores of ``len(candidates)`` chunks placed at ``candidates`` among ``n`` chunks (the
        others ``-inf``; token scores 0)."""
        idx = torch.tensor(candidates, dtype=torch.long, device=self.total.device)

        def wide(x, fill):
            if x is None:
                return None
            out = torch.full((n, *x.shape[1:]), fill, dtype=x.dtype, device=x.device)
            return out.index_copy_(0, idx, x)

        inf = float("-inf")
        tok = None if self.token_scores is None else [wide(t, 0.0) for t in self.token_scores]
        return ChunkScores(
            wide(self.self_info, inf),
            wide(self.pseudo_label, inf),
            wide(self.answer_confidence, inf),
            wide(self.total, inf),
            tok,
            list(candidates),
        )

    @property
    def draft_contrast(self) -> torch.Tensor | None:
        if self.answer_confidence is None or self.pseudo_label is None:
            return None
        diff = self.answer_confidence - self.pseudo_label
        if self.candidates is not None:  # chunks the first stage left out: -inf - -inf
            diff = diff.masked_fill(torch.isnan(diff), float("-inf"))
        return diff


def draft_pseudo_labels(model, prefix: torch.Tensor, query: torch.Tensor, m: int, threshold: float):
    """Draft answer without context: one denoising step over ``prefix + query + m masks``.

    Returns:
        (labels ``[m]`` int64 argmax tokens, confirmed ``[m]`` bool): a slot is confirmed when
        its top-1 probability is >= ``threshold``; the most confident slot always is.
    """
    drafts, _nfe = draft_pseudo_labels_rows(model, [prefix], [query], m, threshold)
    return drafts[0]


def draft_pseudo_labels_rows(model, prefixes: list, queries: list, m: int, threshold: float):
    """:func:`draft_pseudo_labels` for B rows: rows with the same ``prefix + query`` share one draft,
    and drafts of one length run as one batch (no padding, so each equals its own forward).

    Returns:
        (B ``(labels, confirmed)`` pairs, number of model forwards).
    """
    dev = queries[0].device
    masks = torch.full((m,), model.mask_token_id, dtype=torch.long, device=dev)
    unique: dict[tuple, int] = {}  # token ids -> index into seqs
    seqs, of_row = [], []
    for prefix, query in zip(prefixes, queries, strict=True):
        ids = torch.cat([prefix, query, masks])
        key = tuple(ids.tolist())
        if key not in unique:
            unique[key] = len(seqs)
            seqs.append(ids)
        of_row.append(unique[key])
    by_len: dict[int, list[int]] = {}
    for i, ids in enumerate(seqs):
        by_len.setdefault(ids.numel(), []).append(i)
    drafts = [None] * len(seqs)
    for n, members in by_len.items():
        ids = torch.stack([seqs[i] for i in members])
        out = model(ids, torch.arange(n, device=dev), logits_start=n - m)
        probs = torch.softmax(out.logits.float(), dim=-1)  # [G, m, V]
        conf, labels = probs.max(dim=-1)
        for g, i in enumerate(members):
            confirmed = conf[g] >= threshold
            confirmed[conf[g].argmax()] = True
            drafts[i] = (labels[g], confirmed)
    return [drafts[i] for i in of_row], len(by_len)


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


@dataclass
class _Run:
    """Scoring rows ``lo..hi-1`` of one pass: chunks ``c0..c0+hi-lo-1`` of request ``row``."""

    row: int
    lo: int
    hi: int
    c0: int
    slot0: int  # pool slot of the run's first chunk


def _runs(order: list, lo: int, hi: int) -> list:
    """Split scoring rows ``lo..hi-1`` of ``order`` (``(row, chunk, slot)`` each) into runs of one request."""
    runs = []
    for i in range(lo, hi):
        row, c, slot = order[i]
        if runs and runs[-1].row == row:
            runs[-1].hi = i - lo + 1
        else:
            runs.append(_Run(row, i - lo, i - lo + 1, c, slot))
    return runs


def _live_batch(lives: list, runs: list, pad_id: int):
    """Each scoring row's live tokens, padded to the longest: ids ``[n, M]``, live_lens ``[n]`` int32 or None."""
    n = runs[-1].hi
    longest = max(lives[r.row].numel() for r in runs)
    dev = lives[runs[0].row].device
    ids = torch.full((n, longest), pad_id, dtype=torch.long, device=dev)
    lens = []
    for r in runs:
        live = lives[r.row]
        ids[r.lo : r.hi, : live.numel()] = live
        lens += [live.numel()] * (r.hi - r.lo)
    ragged = any(x != longest for x in lens)
    return ids, (torch.tensor(lens, dtype=torch.int32, device=dev) if ragged else None)


def _cached_pass(model, pool: ChunkCache, slots: torch.Tensor, ids, live_lens, runs, lives, token_acc=None):
    """Scoring tokens ``ids [n, M]`` (row i padded past ``live_lens[i]``) against pool chunks
    ``slots [n]``: logits ``[n, M, V]``. With ``token_acc``, per request and layer, the attention mass
    of its own scoring tokens (padding excluded) on each chunk token is added to ``token_acc[row]``."""
    n, m = ids.shape
    lens = pool.lens.index_select(0, slots)
    pos = lens[:, None].long() + torch.arange(m, device=ids.device)[None]
    cache = StaticKVCache(pool.k, pool.v, slots.to(torch.int32)[:, None], lens[:, None].clone())
    hook = None
    if token_acc is not None:

        def hook(layer, q, k, v):
            for r in runs:  # one call per request: its chunks are consecutive slots, its live length one
                width = lives[r.row].numel()
                s0, s1 = r.slot0, r.slot0 + r.hi - r.lo
                mass, _extra, _lse = triton_kernels.chunk_attention_scores(
                    q[r.lo : r.hi, :width], pool.k[layer][s0:s1], pool.lens[s0:s1], k_extra=k[r.lo : r.hi, :width]
                )
                token_acc[r.row][layer][r.c0 : r.c0 + r.hi - r.lo] += mass

    out = model(ids, pos, cache, live_lens=live_lens, attn_hook=hook)
    return out.logits


def _causal_pass(model, pool: ChunkCache, slots: torch.Tensor, live: torch.Tensor):
    """Dense forward of ``[BOS chunk] + live`` per chunk with a causal mask over the live tokens
    (``live [n, M]``, one length: causal passes batch only requests of equal live length)."""
    n, t = slots.numel(), pool.k[0].shape[1]
    m = live.shape[1]
    dev = live.device
    raise_if_unshifted(model)
    # Re-encode the chunk rows: the cache holds K/V, not token ids, so we rebuild ids from the context.
    ids = torch.cat([pool.ids.index_select(0, slots), live], dim=1)  # [n, T + M]
    lens = pool.lens.index_select(0, slots).long()
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
    """Raise ``ValueError`` unless ``model`` (a :class:`dllm.DiffusionLM`) has shifted, next-token logits:
    the causal score mode reads position i's prediction of token i+1 (Dream yes, LLaDA no)."""
    if not model.shift_logits:
        raise ValueError("score_mode='causal' needs a model with shifted (next-token) logits, e.g. the Dream family")


@dataclass
class ScoringRow:
    """One request's scoring inputs for :func:`score_chunks_rows`.

    Attributes:
        chunks: its chunk caches (a view of a shared pool or a document's, see ``ChunkCache.root``).
        query: ``[Mq]`` its query-window tokens (scoring tokens).
        labels, confirmed: ``[m]`` its draft tokens and which are confirmed pseudo-labels.
    """

    chunks: ChunkCache
    query: torch.Tensor
    labels: torch.Tensor
    confirmed: torch.Tensor


@torch.no_grad()
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
    rows, nfe = score_chunks_rows(
        model,
        [ScoringRow(chunks, query, labels, confirmed)],
        mode=mode,
        terms=terms,
        token_scores=token_scores,
        batch=batch,
    )
    return rows[0], nfe


@torch.no_grad()
def score_chunks_rows(
    model,
    rows: list,
    *,
    mode: str = "dllm",
    terms=("self_info", "pseudo_label"),
    token_scores: bool = False,
    batch: int | None = None,
):
    """:func:`score_chunks` for B requests in shared forwards: their chunks stacked along N.

    The requests whose chunks live in one pool (the chunks encoded together by
    :func:`~dllm.prefilling.chunks.encode_chunks_rows`, or one :class:`DocumentCache` shared by
    several questions) are scored in the same passes, ``batch`` chunks per forward (None = all): each
    scoring row is one chunk with its own request's scoring tokens, padded to the longest request of
    the pass; the padding is cut off by ``split_s_attention``'s ``live_lens`` (the keys) and is never
    read (the queries), so each request's scores are those of its own run. ``causal`` passes,
    which attend densely, batch the requests of equal live length.

    Args:
        model: the dLLM.
        rows: B :class:`ScoringRow`.
        mode, terms, token_scores, batch: as :func:`score_chunks` (``batch`` counts chunks of all rows).

    Returns:
        (B :class:`ChunkScores`, number of model forwards).
    """
    causal = mode == "causal"  # one pass gives every term
    need_i = causal or "self_info" in terms
    need_pc = causal or bool({"pseudo_label", "answer_confidence", "draft_contrast"} & set(terms)) or token_scores
    acc = [_RowScores(model, r, token_scores) for r in rows]
    pools: dict[int, tuple] = {}  # id(pool) -> (pool, [(row, chunk, slot), ...]): one entry per scoring row
    for b, r in enumerate(rows):
        pool, off = r.chunks.root
        pools.setdefault(id(pool), (pool, []))[1].extend((b, c, off + c) for c in range(r.chunks.num_chunks))
    mask_id, nfe = model.mask_token_id, 0
    for pool, order in pools.values():
        step = batch or len(order)
        for lo in range(0, len(order), step):
            hi = min(len(order), lo + step)
            runs = _runs(order, lo, hi)
            slots = torch.tensor([order[i][2] for i in range(lo, hi)], dtype=torch.long, device=pool.lens.device)
            if causal:
                # next-token log-probs: query tokens and confirmed labels both visible, causal order
                for group in _equal_width(runs, [a.live_causal for a in acc]):
                    base = group[0].lo
                    group = [_Run(g.row, g.lo - base, g.hi - base, g.c0, g.slot0) for g in group]
                    ids, _ = _live_batch([a.live_causal for a in acc], group, mask_id)
                    logits = _causal_pass(model, pool, slots[base : base + group[-1].hi], ids)
                    nfe += 1
                    for run in group:
                        acc[run.row].add_self_info(run, logits)
                        acc[run.row].add_draft_terms(run, logits)
            if need_i and not causal:
                ids, lens = _live_batch([a.live_i for a in acc], runs, mask_id)
                logits = _cached_pass(model, pool, slots, ids, lens, runs, [a.live_i for a in acc])
                nfe += 1
                for run in runs:
                    acc[run.row].add_self_info(run, logits)
            if (need_pc and not causal) or token_scores:
                # (causal mode runs this pass for the token scores only)
                lives = [a.live_pc for a in acc]
                ids, lens = _live_batch(lives, runs, mask_id)
                token_acc = [a.tokens for a in acc] if token_scores else None
                logits = _cached_pass(model, pool, slots, ids, lens, runs, lives, token_acc)
                nfe += 1
                if not causal:
                    for run in runs:
                        acc[run.row].add_draft_terms(run, logits)
    return [a.scores(need_i, need_pc, terms) for a in acc], nfe


class _RowScores:
    """One request's scoring tokens and its score terms, filled pass by pass."""

    def __init__(self, model, row: ScoringRow, token_scores: bool):
        self.row = row
        n, dev = row.chunks.num_chunks, row.query.device
        mask_id = model.mask_token_id
        masks = torch.full((row.labels.numel(),), mask_id, dtype=torch.long, device=dev)
        self.live_pc = torch.cat([row.query, masks])  # s_P, s_C (and token scores): query + draft slots
        self.live_i = torch.full_like(self.live_pc, mask_id)  # s_I: the query masked too
        self.live_causal = torch.cat([row.query, torch.where(row.confirmed, row.labels, masks)])
        self.q_sel = torch.ones(row.query.numel(), dtype=torch.bool, device=dev)
        if model.shift_logits:  # the first live token has no live predecessor to predict it from
            self.q_sel[0] = False
        self.s_i, self.s_p, self.s_c = (torch.zeros(n, dtype=torch.float32, device=dev) for _ in range(3))
        self.tokens = None
        if token_scores:
            cfg, t = model.config, row.chunks.root[0].k[0].shape[1]
            self.tokens = [
                torch.zeros(n, cfg.num_kv_heads, t, dtype=torch.float32, device=dev) for _ in range(cfg.num_layers)
            ]

    def add_self_info(self, run: _Run, logits: torch.Tensor) -> None:
        """s_I of the run's chunks from their logits rows ``[run.lo:run.hi]`` (query columns first)."""
        mq = self.row.query.numel()
        # (causal: token 0 would be predicted from the last chunk row, which is padding in a short last chunk)
        self.s_i[run.c0 : run.c0 + run.hi - run.lo] = _mean_logprob(
            logits[run.lo : run.hi, :mq], self.row.query, self.q_sel
        )

    def add_draft_terms(self, run: _Run, logits: torch.Tensor) -> None:
        """s_P and s_C of the run's chunks from the draft-slot columns after the query."""
        mq, m = self.row.query.numel(), self.row.labels.numel()
        slots = logits[run.lo : run.hi, mq : mq + m]
        sl = slice(run.c0, run.c0 + run.hi - run.lo)
        self.s_p[sl] = _mean_logprob(slots, self.row.labels, self.row.confirmed)
        self.s_c[sl] = _top1_logprob(slots)

    def scores(self, need_i: bool, need_pc: bool, terms) -> ChunkScores:
        sc = ChunkScores(
            self.s_i if need_i else None,
            self.s_p if need_pc else None,
            self.s_c if need_pc else None,
            total=None,  # set below, from the terms just stored
            token_scores=self.tokens,
        )
        sc.total = sum(getattr(sc, t) for t in terms)  # term names are the attribute names
        return sc


def _equal_width(runs: list, lives: list) -> list:
    """Consecutive runs grouped by their request's live length (causal passes do not pad)."""
    groups = []
    for r in runs:
        if groups and lives[groups[-1][-1].row].numel() == lives[r.row].numel():
            groups[-1].append(r)
        else:
            groups.append([r])
    return groups
