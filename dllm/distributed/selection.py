"""Chunk selection across ranks: the same choice as one process (:func:`dllm.prefilling.score_and_select`),
each stage run where the chunks live and only per-chunk numbers exchanged.

    root:    draft pseudo-labels (prefix + query, no context) -> broadcast query window + draft
    rank r:  first stage (``candidates``): its chunks' cheap scores  -> all_gather; top-n on the whole [N]
    rank r:  predictive scores of its (candidate) chunks            -> all_gather in chunk order
    all:     with ``lexical_weight``, the lexical scores of every chunk from the all-gathered token ids
    all:     top-K of the gathered scores, redundancy-aware with ``redundancy_threshold`` (the chunks' token
             ids all-gathered once per document: ids only, no K/V), the same tensor everywhere: the same choice

The scoring tokens' own per-layer K/V are not broadcast: in a scoring pass they attend to the chunk
bidirectionally, so from the second layer on they depend on the chunk and each rank computes them in its
own forward, exactly as one process does.
"""

from __future__ import annotations

import torch

from dllm.distributed.group import all_gather, broadcast, run_on_all, world
from dllm.distributed.sharded_document import ShardedDocument
from dllm.distributed.shares import at_width
from dllm.prefilling.config import PrefillingConfig
from dllm.prefilling.lexical import fuse_scores, lexical_ngram, lexical_scores, padded_chunks
from dllm.prefilling.pipeline import Selection, with_lexical_candidates
from dllm.prefilling.prompt import PromptParts
from dllm.prefilling.scoring import ChunkScores, draft_pseudo_labels, score_chunks
from dllm.prefilling.selection import (
    first_stage_candidates,
    first_stage_excess,
    first_stage_maxima,
    kept_chunks,
)

TERMS = ("self_info", "pseudo_label", "answer_confidence")


@torch.no_grad()
def score_and_select(model, doc: ShardedDocument, prompt: PromptParts | None, cfg: PrefillingConfig, *, root: int = 0):
    """Score every chunk where it lives and choose the top-K identically on every rank.

    Collective. The root drafts pseudo-labels from ``prefix + query`` (no context,
    :func:`~dllm.prefilling.scoring.draft_pseudo_labels`) and broadcasts the query window and the draft. With
    ``cfg.candidates`` (a first stage, fewer than N candidates: :meth:`PrefillingConfig.candidate_count`) every
    rank computes its chunks' :func:`~dllm.prefilling.selection.first_stage_maxima`, and the best candidates of the
    gathered ``[N, F]`` maxima's scores (:func:`~dllm.prefilling.selection.first_stage_excess`, against the whole
    document's median) are the only chunks scored predictively. Every rank scores its (candidate) chunks
    (:func:`~dllm.prefilling.scoring.score_chunks` with ``cfg``'s mode, terms and batch, at the document's
    padded width); the scores are all-gathered in chunk order and the K kept chosen on the gathered tensor by
    :func:`~dllm.prefilling.selection.select_chunks` (``redundancy_threshold``: over the chunks' token ids,
    :meth:`ShardedDocument.context_ids`).

    Args:
        model: the dLLM.
        doc: the sharded document.
        prompt: ``PromptParts(prefix, None, query)`` checked token ids; read on ``root`` only (None elsewhere).
        cfg: the prefilling configuration (``top_k``: K; None keeps every chunk unscored).
        root: the rank that drafts (and later decodes).

    Returns:
        ``(Selection, per-rank scoring forwards)``: the :class:`~dllm.prefilling.pipeline.Selection`
        (``kept`` ascending, ``scores``: :class:`~dllm.prefilling.scoring.ChunkScores` of all N chunks as
        ``[N]`` fp32 CPU tensors, ``-inf`` for chunks a first stage left out and ``candidates`` set, None when
        nothing was scored; ``pseudo_labels``; ``nfe``: the forwards of the busiest rank, draft and first stage
        included) is the same on every rank.
    """
    rank, size = world(doc.group)
    n = doc.num_chunks
    k = n if cfg.top_k is None else cfg.top_k
    if k >= n and (cfg.adaptive_k is None or n == 1):  # adaptive K chooses between 1 and N even at K = N
        return Selection(list(range(n)), None, None, 0), [0] * size

    def draft():
        if rank != root:
            return None
        labels, confirmed = draft_pseudo_labels(
            model, prompt.prefix, prompt.query, cfg.draft_tokens, cfg.draft_threshold
        )
        window = prompt.query if cfg.query_window is None else prompt.query[-cfg.query_window :]
        return window.tolist(), labels.tolist(), confirmed.tolist(), prompt.query.tolist()

    payload = broadcast(run_on_all(draft, doc.group), root, doc.group)
    window, labels, confirmed, query = (torch.tensor(x, device=model.device) for x in payload)
    lexical = None
    if cfg.lexical_weight:  # over every chunk's token ids (all-gathered once per document), the same everywhere
        lexical = lexical_scores(query.cpu(), *padded_chunks(doc.context_ids()), lexical_ngram(model))
    # at the document's padded width: a rank holding a short chunk alone encoded it narrower, and the scoring
    # pass (and the first stage's positions, right after a full chunk) depend on the padded length
    chunks = at_width(doc.local.chunks, doc.width, doc.pad_token_id)
    lo, hi = doc.bounds[rank]
    n_cand = cfg.candidate_count(n, k)  # the one-process rule (an int, or "auto": sublinear in N)
    cands = None
    if n_cand is not None:
        first = run_on_all(
            lambda: first_stage_maxima(model, chunks, window, cfg.draft_tokens, cfg.candidate_layer).cpu(), doc.group
        )
        # the maxima, not the scores, are gathered: a score is measured against the whole document's median
        gathered = first_stage_excess(torch.cat(all_gather(first, doc.group)))
        cands = first_stage_candidates(gathered, n_cand, cfg.neighbours_of(k))  # the one-process rule
        cands = with_lexical_candidates(cands, lexical, k)
        mine = [j - lo for j in cands if lo <= j < hi]
        chunks = chunks.select(mine) if mine else None

    def score():
        if chunks is None:
            return None, 0
        sc, nfe = score_chunks(
            model, chunks, window, labels, confirmed,
            mode=cfg.score_mode, terms=cfg.score_terms, token_scores=False, batch=cfg.prefill_batch,
        )  # fmt: skip
        return {t: (None if getattr(sc, t) is None else getattr(sc, t).float().cpu()) for t in TERMS}, nfe

    everyone = all_gather(run_on_all(score, doc.group), doc.group)
    parts = [e[0] for e in everyone if e[0] is not None]
    terms = {t: None if parts[0][t] is None else torch.cat([p[t] for p in parts]) for t in TERMS}
    scores = ChunkScores(terms["self_info"], terms["pseudo_label"], terms["answer_confidence"], total=None)
    scores.total = sum(getattr(scores, t) for t in cfg.score_terms)  # term names are the attribute names
    if cands is not None:
        scores = scores.scatter(cands, n)
    if lexical is not None:
        scores.lexical = lexical
        scores.total = fuse_scores(scores.total, lexical, cfg.lexical_weight)
    chunk_ids = None
    if cfg.redundancy_threshold is not None:
        all_ids = doc.context_ids()
        chunk_ids = all_ids.__getitem__
    kept = kept_chunks(scores.total, k, cfg.adaptive_k, chunk_ids, cfg.redundancy_threshold)
    pseudo = [lab for lab, c in zip(labels.tolist(), confirmed.tolist()) if c]
    nfe = 1 + (cands is not None) + max(e[1] for e in everyone)
    return Selection(kept, scores, pseudo, nfe), [e[1] for e in everyone]
