"""Lexical chunk score: how much of the query's wording a chunk holds (our extension of Prefilling-dLLM).

The predictive score (:mod:`dllm.prefilling.scoring`) asks whether a chunk helps the model predict the
query and a draft answer; a small model ranks a fact's chunk at chance when every chunk is full of numbers
(bench/results/heldout_eval.md). The lexical score asks only whether the chunk contains the query's
words: the share of the query's distinct token n-grams found in the chunk, each n-gram weighted by BM25's
inverse document frequency over the context's chunks, so n-grams present in every chunk (``the``, a digit,
a section heading) count for little and the query's rare phrase ("pass key", "access code of the Wells
store") for much. This is the lexical half of hybrid retrieval (a sparse term-matching score fused with a
dense one): BM25, Robertson and Zaragoza, "The Probabilistic Relevance Framework: BM25 and Beyond", FnTIR
2009 (the idf below, with binary term frequency: chunks are of nearly equal length, so BM25's length and
term-frequency saturation have nothing to correct); character n-gram matching, Mayfield and McNamee,
"Single N-gram Stemming", SIGIR 2003. :func:`fuse_scores` combines it with the predictive score by a
z-scored weighted sum (scale-free: the two terms' units differ; the convex-combination fusion of Bruch,
Gai and Ingber, "An Analysis of Fusion Functions for Hybrid Retrieval", TOIS 2023, with z-score instead of
min-max normalisation, which one outlier would flatten).

No model forward: one pass over the context's token ids, O(L log Mq) for L context and Mq query tokens (a hash of each
window of n tokens over the query's distinct tokens, then a binary search among the query's n-grams).

n is chosen per tokenizer (:func:`lexical_ngram`) so that a gram spans about :data:`LEXICAL_CHARS`
characters: 4 for the bundled character-level tokenizer (a short word or a word's stem), 1 for a BPE
vocabulary whose median token has 3 characters or more (a token is a word or a word piece: plain term
matching). Measured on Dream-v0's tokenizer (tests/data/reference): median 5 characters, n = 1, 1.5 s once per
model on a CPU; LLaDA's was not measured.
"""

from __future__ import annotations

import math

import torch

# characters one n-gram should span: a short word or a word's stem (Mayfield and McNamee found 4-5-grams
# best for character n-gram retrieval in English)
LEXICAL_CHARS = 4


def lexical_ngram(model) -> int:
    """n of the lexical score's token n-grams for ``model``'s tokenizer: ``max(1, round(LEXICAL_CHARS /
    median characters per token))``, the median over the vocabulary's non-special tokens decoded alone
    (character-level: 1 character, n = 4; 2 characters: n = 2; 3 or more, as BPE vocabularies: n = 1). A model
    without a tokenizer gets 1 (token unigrams: BM25's plain term match). Computed once and cached on the
    model (one decode per vocabulary entry, as :func:`dllm.prefilling.chunks.sentence_end_table`)."""
    cached = getattr(model, "_dllm_lexical_ngram", None)
    if cached is not None:
        return cached
    tok = getattr(model, "tokenizer", None)
    n = 1
    if tok is not None:
        special = set(getattr(tok, "all_special_ids", []) or [])
        ids = [[i] for i in range(min(model.config.vocab_size, len(tok))) if i not in special]
        lengths = sorted(len(t) for t in tok.batch_decode(ids, clean_up_tokenization_spaces=False) if t)
        if lengths:
            n = max(1, round(LEXICAL_CHARS / max(1, lengths[len(lengths) // 2])))
    try:
        model._dllm_lexical_ngram = n
    except AttributeError:  # pragma: no cover - a model class that forbids new attributes
        pass
    return n


def lexical_scores(query: torch.Tensor, chunk_ids: torch.Tensor, lens: torch.Tensor, n: int, *, idf: bool = True):
    """Lexical score of every chunk: the (idf-weighted) share of the query's distinct token ``n``-grams that
    occur in the chunk.

    ``score_j = sum_{g in G(q) & G(c_j)} w_g / sum_{g in G(q)} w_g`` with ``G(x)`` the set of n-grams of x;
    ``w_g = log(1 + (N - df_g + 0.5) / (df_g + 0.5))`` (BM25's idf, always > 0; ``df_g``: the chunks holding
    g) with ``idf``, else 1 (the plain share). A query shorter than n tokens is one gram (the whole query);
    a chunk shorter than the gram holds none. Padding (columns at or past ``lens``) is never read.

    Args:
        query: ``[Mq]`` integer token ids, Mq >= 1 (the question, without the instruction prefix).
        chunk_ids: ``[N, T]`` integer token ids of the chunks' context tokens (no anchor), row j valid up to
            ``lens[j]``.
        lens: ``[N]`` integer context tokens per chunk, ``0 <= lens[j] <= T``.
        n: tokens per gram, >= 1 (:func:`lexical_ngram`).
        idf: weight each gram by its inverse document frequency over the N chunks.

    Returns:
        ``[N]`` fp32 on ``chunk_ids``' device, in [0, 1] (1: every query gram in the chunk). Ties are
        equal values (ranking breaks them by chunk order, :func:`~dllm.prefilling.selection.rank_chunks`).

    Raises:
        ValueError: an empty query, non-integer ids, shapes that do not match, ``lens`` outside [0, T], n < 1,
            or a query with so many distinct tokens that its n-grams cannot be numbered in 63 bits.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    for name, x in (("query", query), ("chunk_ids", chunk_ids), ("lens", lens)):
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise ValueError(f"{name} must hold integer token ids, got dtype {x.dtype}")
    if query.dim() != 1 or query.numel() == 0:
        raise ValueError(f"query must be a non-empty [Mq] tensor, got shape {tuple(query.shape)}")
    if chunk_ids.dim() != 2 or lens.shape != (chunk_ids.shape[0],):
        raise ValueError(f"chunk_ids must be [N, T] and lens [N], got {tuple(chunk_ids.shape)} and {tuple(lens.shape)}")
    num, width = chunk_ids.shape
    if num and (int(lens.min()) < 0 or int(lens.max()) > width):
        raise ValueError(f"lens must be in [0, T={width}], got {lens.tolist()}")
    dev = chunk_ids.device
    query = query.to(dev).long()
    n = min(n, query.numel())
    vocab, q_codes = torch.unique(query, return_inverse=True)  # the query's distinct tokens, sorted
    base = vocab.numel() + 1
    if base**n >= 2**63:
        raise ValueError(f"{vocab.numel()} distinct query tokens give too many {n}-grams to number; lower n")
    powers = torch.tensor([base ** (n - 1 - i) for i in range(n)], dtype=torch.long, device=dev)
    grams = torch.unique(q_codes.unfold(0, n, 1) @ powers)  # [G] the query's distinct n-grams, sorted
    present = torch.zeros(num, grams.numel(), dtype=torch.bool, device=dev)
    if width >= n and num:
        ids = chunk_ids.long().contiguous()
        pos = torch.searchsorted(vocab, ids).clamp(max=vocab.numel() - 1)
        inside = torch.arange(width, device=dev)[None, :] < lens.to(dev)[:, None]
        known = (vocab[pos] == ids) & inside  # a token of the query, and not padding
        codes = torch.where(known, pos, 0)
        windows = codes.unfold(1, n, 1)  # [N, W, n] views
        valid = known.unfold(1, n, 1).all(dim=-1)
        keys = (windows * powers).sum(dim=-1)  # [N, W]
        at = torch.searchsorted(grams, keys).clamp(max=grams.numel() - 1)
        hit = valid & (grams[at] == keys)
        rows = torch.arange(num, device=dev)[:, None].expand_as(hit)
        present[rows[hit], at[hit]] = True
    weights = torch.ones(grams.numel(), dtype=torch.float32, device=dev)
    if idf:
        df = present.sum(dim=0).float()
        weights = torch.log1p((num - df + 0.5) / (df + 0.5))
    return (present.float() @ weights) / weights.sum()


def chunk_lexical_scores(query: torch.Tensor, chunks, n: int) -> torch.Tensor:
    """:func:`lexical_scores` (with idf) of every chunk of a :class:`~dllm.prefilling.chunks.ChunkCache`
    (its ``ids [N, C+1]`` without the anchor column, ``lens - 1`` context tokens): ``[N]`` fp32."""
    return lexical_scores(query, chunks.ids[:, 1:], chunks.lens.long() - 1, n)


def padded_chunks(chunk_ids: list) -> tuple[torch.Tensor, torch.Tensor]:
    """``[c_j]`` token tensors -> ``(ids [N, max c_j] int64, lens [N] int64)`` for :func:`lexical_scores`."""
    lens = torch.tensor([x.numel() for x in chunk_ids], dtype=torch.long)
    ids = torch.zeros(len(chunk_ids), max(1, int(lens.max()) if len(chunk_ids) else 1), dtype=torch.long)
    for j, x in enumerate(chunk_ids):
        ids[j, : x.numel()] = x.cpu()
    return ids, lens


def zscore(x: torch.Tensor) -> torch.Tensor:
    """``(x - mean) / std`` over the finite entries of ``x [N]`` (fp32; 0 where all finite entries are
    equal: a term that cannot tell chunks apart adds nothing); non-finite entries stay as they are."""
    x = x.float()
    finite = torch.isfinite(x)
    out = x.clone()
    vals = x[finite]
    if vals.numel():
        std = vals.std(unbiased=False)
        out[finite] = (vals - vals.mean()) / std if float(std) > 0 else torch.zeros_like(vals)
    return out


def fuse_scores(predictive: torch.Tensor, lexical: torch.Tensor, weight: float) -> torch.Tensor:
    """The chunk score with a lexical term: ``z(predictive) + weight * z(lexical)`` (:func:`zscore` over the
    chunks whose predictive score is finite; a chunk a first stage left out, ``-inf``, stays ``-inf``).

    Args:
        predictive: ``[N]`` float, the predictive score (``ChunkScores.total``; ``-inf`` = not scored).
        lexical: ``[N]`` float, :func:`lexical_scores`.
        weight: the lexical term's weight, >= 0 (``PrefillingConfig.lexical_weight``).

    Returns:
        ``[N]`` fp32: higher = more relevant; no NaN.

    Raises:
        ValueError: shapes differ, or a negative or non-finite weight.
    """
    if predictive.shape != lexical.shape or predictive.dim() != 1:
        raise ValueError(
            f"predictive and lexical must both be [N], got {tuple(predictive.shape)}, {tuple(lexical.shape)}"
        )
    if not math.isfinite(weight) or weight < 0:
        raise ValueError(f"weight must be a finite number >= 0, got {weight!r}")
    finite = torch.isfinite(predictive)
    lex = lexical.float().to(predictive.device).masked_fill(~finite, float("-inf"))
    fused = zscore(predictive) + weight * zscore(lex)
    return fused.masked_fill(~finite, float("-inf"))
