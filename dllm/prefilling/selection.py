"""Chunk selection beyond the paper's plain top-K: a cheap first stage, redundancy-aware top-K, adaptive K.

Both are our extensions of Prefilling-dLLM (arXiv 2606.10537), off by default
(``PrefillingConfig(candidates=None, redundancy_threshold=None)`` is the paper's selection):

- :func:`first_stage_scores` ranks every chunk by how far the largest attention logits that the scoring
  tokens' queries (computed without any context, in one small forward) reach on the chunk's cached
  keys in one layer stand out from the document's median chunk (:func:`first_stage_excess`). It costs
  one matrix product per KV head over the document's keys of that layer (no MLP, no other layer, no
  softmax), against a full forward of the scoring tokens per chunk for the predictive score; only the
  ``candidates`` best chunks are then scored predictively. A max is used rather than a mean key per
  chunk because a fact is a few tokens of a chunk: a mean dilutes them by 1/C (measured:
  bench/results/selection_scale.md).
- :func:`select_chunks` keeps the top-K by score, but passes over a chunk whose token n-grams
  overlap an already kept chunk's by a Jaccard similarity of at least ``threshold`` while other
  chunks remain (greedy, in score order; the maximal-marginal-relevance idea of Carbonell and
  Goldstein, SIGIR 1998, with a hard threshold): repeated boilerplate then takes one slot of K, not all.
- :func:`adaptive_top_k` (``PrefillingConfig.adaptive_k``, off by default) chooses K per question, up to the
  configured K: the chunks above the first drop between ranked scores of at least a margin of robust
  spreads, so a clear winner is kept alone and an unclear ranking keeps up to K.
"""

from __future__ import annotations

import math
import numbers

import torch

# n of the token n-grams compared by select_chunks (8 tokens: a short phrase for a BPE vocabulary, a
# word or two at character level; repeated filler shares them, distinct sentences rarely do)
NGRAM = 8
# scoring tokens whose queries the first stage uses: the last ones of query + draft slots (the draft
# slots ask for the answer; the query's end says what is asked)
FIRST_STAGE_QUERIES = 8
_BLOCK = 512  # chunks per matrix product of the first stage (bounds its fp32 logits to BLOCK*T*8*G*4 bytes)


def ngram_set(ids: torch.Tensor, n: int = NGRAM) -> frozenset:
    """The set of token ``n``-grams of ``ids [L]`` (the whole sequence as one gram when ``L < n``)."""
    x = ids.tolist()
    if len(x) < n:
        return frozenset([tuple(x)])
    return frozenset(tuple(x[i : i + n]) for i in range(len(x) - n + 1))


def jaccard(a: frozenset, b: frozenset) -> float:
    """``|a & b| / |a | b|`` (1.0 for two empty sets)."""
    union = len(a | b)
    return 1.0 if union == 0 else len(a & b) / union


def rank_chunks(scores: torch.Tensor) -> list:
    """Chunk indices best first: descending score, ties to the earlier chunk, NaN scores last (a NaN
    never outranks a number, not even ``-inf``).

    Args:
        scores: ``[N]`` float chunk scores.

    Returns:
        the N indices, a permutation of ``range(N)``.
    """
    scores = scores.detach().cpu()
    if not scores.is_floating_point() or scores.element_size() < 8:
        scores = scores.double()  # float64 holds every fp32/fp16/bf16 and int score exactly: no tie made by a cast
    nan = torch.isnan(scores)
    key = scores.masked_fill(nan, float("-inf"))
    order = torch.argsort(key, descending=True, stable=True)  # stable: equal scores keep index order
    nan_of = nan[order]
    return torch.cat([order[~nan_of], order[nan_of]]).tolist()


def top_chunks(scores: torch.Tensor, k: int) -> list:
    """The ``k`` best chunks by :func:`rank_chunks` (ties to the earlier chunk, NaN last), ascending."""
    return sorted(rank_chunks(scores)[:k])


def select_chunks(scores: torch.Tensor, k: int, chunk_ids=None, threshold: float | None = None) -> list:
    """The K kept chunks, ascending.

    Ranking (:func:`rank_chunks`): descending score, equal scores to the earlier chunk, and a NaN score
    below every number (it is kept only when K leaves no other choice).

    Args:
        scores: ``[N]`` fp32 chunk scores (higher = more relevant; ``-inf`` = not a candidate).
        k: K, 1 <= K <= N.
        chunk_ids: ``fn(j) -> [c_j]`` int64 context tokens of chunk j (needed with a threshold).
        threshold: None: the paper's top-K. Else a Jaccard similarity in (0, 1]: in
            descending score order (ties: lower index first) a chunk is kept unless its :data:`NGRAM`-gram
            set overlaps a kept chunk's by >= ``threshold``; when fewer than K remain, the passed-over
            chunks fill K in score order.

    Returns:
        K chunk indices, ascending.

    Raises:
        TypeError: K not an integer (an int, a numpy integer or a 0-d integer tensor; a bool or a float is refused).
        ValueError: scores not 1-D, K outside ``[1, N]``, a threshold that is not a real number in (0, 1] (NaN and inf
            included: NaN would pass every chunk over without a word), or a threshold without ``chunk_ids``.
    """
    if isinstance(k, torch.Tensor) and k.dim() == 0 and not (k.dtype.is_floating_point or k.dtype.is_complex):
        k = k.item() if k.dtype != torch.bool else k  # a 0-d integer tensor, as the kernels take one
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"K must be an integer, got {type(k).__name__} {k!r}")
    k = int(k)
    if not isinstance(scores, torch.Tensor) or scores.dim() != 1:
        raise ValueError(f"scores must be a [N] tensor of chunk scores, got {getattr(scores, 'shape', type(scores))}")
    n = int(scores.numel())
    if not 1 <= k <= n:
        raise ValueError(f"K={k} must be in [1, N={n}]")
    if threshold is not None and (
        isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or not 0 < threshold <= 1
    ):  # "not (in range)": NaN fails every comparison
        raise ValueError(f"threshold must be a real number in (0, 1] (None = the paper's top-K), got {threshold!r}")
    order = rank_chunks(scores)
    if threshold is None:
        return sorted(order[:k])
    if chunk_ids is None:
        raise ValueError("redundancy-aware selection needs the chunks' token ids")
    kept, grams, passed = [], [], []
    for j in order:
        if len(kept) == k:
            break
        if not scores[j] > float("-inf"):
            break  # non-candidates (and NaN scores) are reached only to fill K
        g = ngram_set(chunk_ids(j))
        if any(jaccard(g, h) >= threshold for h in grams):
            passed.append(j)
            continue
        kept.append(j)
        grams.append(g)
    if len(kept) < k:
        taken = set(kept) | set(passed)
        fill = passed + [j for j in order if j not in taken]
        kept += fill[: k - len(kept)]
    return sorted(kept)


@torch.no_grad()
def first_stage_maxima(model, chunks, query: torch.Tensor, draft_tokens: int, layer: int | None = None) -> torch.Tensor:
    """The first stage's raw features: per chunk, the largest attention logit that each scoring query (per layer
    and query head) reaches on the chunk's cached keys. :func:`first_stage_excess` turns them into scores.

    The live block ``query + draft_tokens`` mask slots is run alone (no context) at the positions right
    after a full chunk (``T .. T+M-1``, T = C+1: where the predictive score puts it); in each layer read
    the queries (RoPE applied) of its last :data:`FIRST_STAGE_QUERIES` tokens meet every chunk's cached
    keys (context tokens only: the BOS anchor, which every chunk has, is left out):
    ``max_t q . k_t / sqrt(D)`` per chunk and (layer, query head, query).

    Args:
        model: the dLLM.
        chunks: :class:`~dllm.prefilling.chunks.ChunkCache` (per layer K ``[N, T, Hkv, D]``; only the layers
            read need be set).
        query: ``[Mq]`` int64 the query-window tokens.
        draft_tokens: m, mask slots after the query.
        layer: the layer whose queries and keys are compared (negative counts from the last), None = all.

    Returns:
        ``[N, F]`` fp32 on the chunks' device, ``F = layers * Hq * min(FIRST_STAGE_QUERIES, Mq + m)``
        (columns: layer, then KV head, then query, then the query heads of that KV head).

    Raises:
        ValueError: ``layer`` outside the model's layers.
    """
    n_layers = model.config.num_layers
    if layer is not None and not -n_layers <= layer < n_layers:
        raise ValueError(f"candidate_layer={layer} is outside the model's {n_layers} layers")
    layers = range(n_layers) if layer is None else [layer % n_layers]
    n, t, hkv, d = chunks.k[layers[0]].shape  # only the first stage's layers need keys (encode_candidates)
    dev = query.device
    live = torch.cat([query, torch.full((draft_tokens,), model.mask_token_id, dtype=torch.long, device=dev)])
    got = {}

    def hook(i, q, _k, _v):
        if i in layers:
            got[i] = q[0, -FIRST_STAGE_QUERIES:]  # [M, Hq, D]

    model(live[None], torch.arange(t, t + live.numel(), device=dev), logits_start=live.numel(), attn_hook=hook)
    valid = torch.arange(t, device=chunks.lens.device)[None, :] < chunks.lens[:, None]
    valid[:, 0] = False
    cols = []
    for i in layers:
        q = got[i].float()
        m, hq, _ = q.shape
        g = hq // hkv
        q = q.view(m, hkv, g, d).permute(1, 3, 0, 2).reshape(hkv, d, m * g) / d**0.5  # [Hkv, D, M*G]
        out = torch.empty(n, hkv, m * g, dtype=torch.float32, device=chunks.lens.device)
        for lo in range(0, n, _BLOCK):
            hi = min(n, lo + _BLOCK)
            kb = chunks.k[i][lo:hi].float()  # [b, T, Hkv, D]
            for h in range(hkv):
                logits = kb[:, :, h, :] @ q[h]  # [b, T, M*G]
                logits = logits.masked_fill(~valid[lo:hi, :, None], float("-inf"))
                out[lo:hi, h] = logits.amax(1)
        cols.append(out.reshape(n, -1))
    return torch.cat(cols, 1)


def first_stage_excess(maxima: torch.Tensor) -> torch.Tensor:
    """First-stage scores from :func:`first_stage_maxima`: how far each chunk's largest logits stand out from the
    document's typical chunk, ``mean_f max(0, x_jf - median_j' x_j'f)`` over the features f.

    Why an excess over the median rather than the plain mean of the maxima: a chunk's largest logit per query
    mostly says which tokens it contains, and text every chunk has (filler, a repeated phrase) sets that
    maximum in most chunks alike. A fact stands out only by the features it raises above the others, while a
    short chunk (the last one, or one cut by a snapped boundary) lacks some common tokens and so scores lower
    on the plain mean whatever it holds: measured on the demo's passkey at 32K, depth 1.0, the needle's 97-token
    last chunk ranked 66 of 133 in layer 0 on the mean (outside the 32 candidates), 0 on the excess
    (bench/results/first_stage_excess.md). Only features above the median count, so what a chunk lacks costs
    nothing. The median is over the chunks of the whole document: a sharded run gathers the maxima, not the
    scores. Our extension (a robust per-feature centring, in the spirit of a max-pooled retrieval score such as
    ColBERT's late interaction, Khattab and Zaharia, SIGIR 2020, with a background subtracted).

    Args:
        maxima: ``[N, F]`` float, N >= 1 (NaN-free: every chunk has at least one context token).

    Returns:
        ``[N]`` fp32, >= 0 (a chunk at or below the median on every feature scores 0).

    Raises:
        ValueError: not a 2-D tensor with at least one row and one column.
    """
    if not isinstance(maxima, torch.Tensor) or maxima.dim() != 2 or 0 in maxima.shape:
        raise ValueError(f"maxima must be a non-empty [N, F] tensor, got {getattr(maxima, 'shape', type(maxima))}")
    x = maxima.float()
    med = x.median(0).values  # the lower middle value for an even N: no interpolation, exact in any order
    return (x - med).clamp_min(0).mean(1)


def first_stage_scores(model, chunks, query: torch.Tensor, draft_tokens: int, layer: int | None = None) -> torch.Tensor:
    """Cheap per-chunk relevance: how far the largest attention logits the scoring tokens reach in a chunk stand
    out from the document's typical chunk (:func:`first_stage_excess` of :func:`first_stage_maxima`).

    ``layer=None`` reads every layer (which layer separates best depends on the model; for the bundled model
    layer 1 does best, layer 0 is the cheap one for a fresh context).

    Args:
        as :func:`first_stage_maxima`.

    Returns:
        ``[N]`` fp32 on the chunks' device, >= 0.

    Raises:
        ValueError: ``layer`` outside the model's layers.
    """
    return first_stage_excess(first_stage_maxima(model, chunks, query, draft_tokens, layer))


def robust_spread(scores: torch.Tensor) -> float:
    """The spread of chunk scores that a few outstanding chunks do not move: ``1.4826 * median(|s - median(s)|)``
    (the median absolute deviation, scaled to a standard deviation for normal scores; lower middle values, no
    interpolation), or, when that is 0 because half the scores or more are equal (repeated filler chunks; any
    two scores), ``1.2533 * mean(|s - median(s)|)`` (the mean absolute deviation, scaled the same way). 0 only
    when every score is equal. Used by :func:`adaptive_top_k`.

    Args:
        scores: ``[n]`` finite float scores, n >= 1 (the caller drops ``-inf`` and NaN).

    Returns:
        the spread, a float >= 0, in the scores' units.
    """
    s = scores.double()
    dev = (s - s.median()).abs()
    return 1.4826 * float(dev.median()) or 1.2533 * float(dev.mean())


def adaptive_top_k(scores: torch.Tensor, floor: int, ceiling: int, margin: float) -> int:
    """K chosen per question by how far the best scores stand out: the chunks above the first large drop.

    Rule (our extension of Prefilling-dLLM's fixed top-K, arXiv 2606.10537): rank the chunks
    (:func:`rank_chunks`; only finite scores count), let ``s_1 >= s_2 >= ...`` be their scores and
    ``sigma = 1.4826 * median(|s - median(s)|)`` the scores' robust spread (the median absolute deviation,
    scaled to a standard deviation for normal scores; it does not grow with the document's length, and a
    few outstanding chunks do not move it). K is the first ``k`` in ``[floor, ceiling)`` whose drop to the
    next chunk is at least ``margin`` spreads, ``s_k - s_{k+1} >= margin * sigma``; when no drop is that
    large (nothing stands out), K is ``ceiling``. When at least half the scores are equal (repeated filler
    chunks score alike; two chunks always) the median absolute deviation is 0, and the spread is the mean
    absolute deviation from the median instead, ``1.2533 * mean(|s - median(s)|)`` (also scaled to a standard
    deviation): one chunk above 38 equal ones stands out, it is not a reason to keep the ceiling. Only when
    every score is equal is there no spread: K is ``ceiling``. Both bounds are
    capped at the finite scores' count. One setting serves every document length: a 4K and a 1M document
    are both cut where their own scores drop, never deeper than ``ceiling``.

    Args:
        scores: ``[N]`` float chunk scores (``-inf`` or NaN: not a candidate).
        floor: the fewest chunks kept, >= 1.
        ceiling: the most, >= floor.
        margin: a drop of at least this many robust spreads ends the kept set, > 0.

    Returns:
        K, ``min(floor, n) <= K <= min(ceiling, n)`` with n the finite scores' count (but at least 1, so
        a vector with no finite score keeps one chunk).

    Raises:
        ValueError: an empty vector, ``floor < 1``, ``ceiling < floor`` or a margin that is not a finite
            number > 0.
    """
    n_all = int(scores.numel())
    if n_all == 0:
        raise ValueError("adaptive_top_k needs at least one chunk score")
    if not 1 <= floor <= ceiling:
        raise ValueError(f"adaptive K needs 1 <= floor <= ceiling, got floor={floor}, ceiling={ceiling}")
    try:
        ok = isinstance(margin, (int, float)) and not isinstance(margin, bool) and math.isfinite(float(margin))
    except OverflowError:  # an int past float's range
        ok = False
    if not (ok and margin > 0):
        raise ValueError(f"adaptive K needs a finite margin > 0, got {margin!r}")
    s = scores.detach().cpu().double()
    s = s[torch.isfinite(s)]
    n = int(s.numel())
    if n == 0:
        return 1
    lo, hi = min(floor, n), min(ceiling, n)
    top = torch.sort(s, descending=True).values
    sigma = robust_spread(s)
    if sigma > 0:
        for k in range(lo, hi):  # k chunks kept when the drop after the k-th is large
            if float(top[k - 1] - top[k]) >= margin * sigma:
                return k
    return hi


def kept_count(scores: torch.Tensor, k: int, adaptive_margin: float | None) -> int:
    """The number of chunks chosen by score of ``scores [N]`` under a configured ``K = k`` (<= N): ``k`` itself
    (the paper's fixed K), or with ``adaptive_margin`` (``PrefillingConfig.adaptive_k``)
    :func:`adaptive_top_k` between 1 and ``k`` (:func:`kept_chunks` may add the best chunk's neighbour)."""
    return k if adaptive_margin is None else adaptive_top_k(scores, 1, k, adaptive_margin)


def kept_chunks(scores: torch.Tensor, k: int, adaptive_margin: float | None, chunk_ids=None, threshold=None) -> list:
    """The kept chunks of ``scores [N]``, ascending: the one rule of the library and the sharded run.

    Fixed K (``adaptive_margin`` None): :func:`select_chunks` with K = ``k``, the paper's top-K. Adaptive K
    (our extension): the :func:`adaptive_top_k` best (between 1 and ``k``), and when that is below ``k``, also
    the better-scoring neighbour (``j - 1`` or ``j + 1``, finite scores only) of the best chunk ``j`` when that
    neighbour ranks among the ``k`` best: a fact whose sentences straddle a chunk boundary lies in two chunks,
    both of which score high, and a reader given only the second half misread it (a lost-in-the-middle pass key
    at 4K and a fresh 100K one, ``bench/results/adaptive_k.md``), as the first stage brings neighbours for the
    same reason (:func:`first_stage_candidates`). A neighbour outside the ``k`` best is a plain distractor
    beside the fact: keeping it anyway cost 6 of 57 kept facts on the copy evaluation's tuning cases
    (``bench/results/copy_levers/neighbour_rules/``).

    Args:
        scores: ``[N]`` float chunk scores (``-inf``: not a candidate).
        k: K, the fixed count or the adaptive ceiling, 1 <= K <= N.
        adaptive_margin: None or the margin of :func:`adaptive_top_k`.
        chunk_ids, threshold: redundancy-aware selection (:func:`select_chunks`).

    Returns:
        chunk indices, ascending: ``k`` of them, or with a margin between 1 and ``k``.

    Raises:
        ValueError: what :func:`adaptive_top_k` and :func:`select_chunks` refuse (no score, K outside
            ``[1, N]``, a margin that is not a finite number > 0, a threshold outside ``(0, 1]``).
    """
    n = kept_count(scores, k, adaptive_margin)
    kept = select_chunks(scores, n, chunk_ids, threshold)
    if adaptive_margin is None or n >= k:
        return kept
    top = rank_chunks(scores)[:k]
    best, total = top[0], int(scores.numel())
    near = [j for j in (best - 1, best + 1) if 0 <= j < total and math.isfinite(float(scores[j]))]
    if near:
        j = max(near, key=lambda j: (float(scores[j]), -j))  # ties: the earlier chunk
        if j not in kept and j in top:
            kept = sorted([*kept, j])
    return kept


def first_stage_candidates(scores: torch.Tensor, n: int, neighbours_of: int = 0) -> list:
    """The chunks a first stage passes on: the ``n`` best by :func:`rank_chunks`, plus the two neighbours
    (``j - 1``, ``j + 1``) of each of the best ``neighbours_of`` (our extension, ``candidates="auto"``: a fact cut
    by a chunk boundary lies in two adjacent chunks, and the first stage may rank only one of them high).

    Args:
        scores: ``[N]`` float first-stage scores.
        n: 1 <= n <= N.
        neighbours_of: how many of the best bring their neighbours, >= 0.

    Returns:
        between ``min(n, N)`` and ``n + 2 * neighbours_of`` chunk indices, ascending.

    Raises:
        ValueError: ``n`` outside ``[1, N]`` or ``neighbours_of < 0``.
    """
    total = int(scores.numel())
    if not 1 <= n <= total or neighbours_of < 0:
        raise ValueError(f"n={n} must be in [1, N={total}] and neighbours_of={neighbours_of} >= 0")
    order = rank_chunks(scores)
    picked = set(order[:n])
    for j in order[:neighbours_of]:
        picked.update(x for x in (j - 1, j + 1) if 0 <= x < total)
    return sorted(picked)
