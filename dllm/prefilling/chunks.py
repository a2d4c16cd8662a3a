"""Chunked prefill: cut the context into chunks, prepend a BOS anchor to each, encode them independently.

Each chunk ``BOS + c_j tokens`` is encoded alone, bidirectionally, at local
positions ``0..c_j`` (all chunks as one padded batch ``[N, C+1]``), so the cost is
``O(N * C^2)``: linear in the context length. Under RoPE the cached values and the
keys (up to one rotation) do not depend on where the chunk will sit later, so the
same cache serves every position mode and every question on the same document
(Prefilling-dLLM, arXiv 2606.10537, section "chunked prefill").
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from dllm.prefilling.memory import default_prefill_batch


@dataclass
class ChunkCache:
    """K/V of independently encoded chunks.

    Attributes:
        k, v: per layer ``[N, C+1, Hkv, D]`` (model dtype); keys rotated at local positions
            (the BOS anchor at 0); rows beyond ``lens`` are padding.
        lens: ``[N]`` int32, cached tokens per chunk (BOS + context tokens).
        starts: offset of each chunk's first context token in the context.
        ids: ``[N, C+1]`` int64 the encoded tokens (BOS, chunk, padding).
        pool, pool_offset: the cache these chunks are a slice of (rows ``pool_offset ..
            pool_offset + N - 1``), or None: see :attr:`root`.
    """

    k: list
    v: list
    lens: torch.Tensor
    starts: list
    ids: torch.Tensor
    pool: ChunkCache | None = None
    pool_offset: int = 0

    @property
    def root(self) -> tuple[ChunkCache, int]:
        """``(pool, offset)``: the cache these chunks are rows of and where they start in it (itself
        and 0 unless it is a slice of a batch's encoding: :func:`encode_chunks_rows`). Chunk scoring
        batches the rows of one pool in one forward without copying their K/V."""
        return (self, 0) if self.pool is None else (self.pool, self.pool_offset)

    def rows(self, lo: int, n: int) -> ChunkCache:
        """Chunks ``lo .. lo+n-1`` as a view (no copy) that remembers this cache as its pool."""
        base, off = self.root
        return ChunkCache(
            [k[lo : lo + n] for k in self.k],
            [v[lo : lo + n] for v in self.v],
            self.lens[lo : lo + n],
            self.starts[lo : lo + n],
            self.ids[lo : lo + n],
            base,
            off + lo,
        )

    def select(self, indices: list) -> ChunkCache:
        """Chunks ``indices`` (any order) as a new cache (K/V copied: ``index_select``), its own pool."""
        idx = torch.tensor(indices, dtype=torch.long, device=self.lens.device)
        return ChunkCache(
            [k.index_select(0, idx) for k in self.k],
            [v.index_select(0, idx) for v in self.v],
            self.lens.index_select(0, idx),
            [self.starts[j] for j in indices],
            self.ids.index_select(0, idx),
        )

    @property
    def num_chunks(self) -> int:
        return int(self.lens.numel())

    def sizes(self) -> list:
        """Context tokens per chunk (without the BOS anchor)."""
        return [n - 1 for n in self.lens.tolist()]

    def context_ids(self, j: int) -> torch.Tensor:
        """``[c_j]`` int64: the context tokens of chunk ``j`` (anchor and padding dropped)."""
        return self.ids[j, 1 : int(self.lens[j])]


def pad_token_id(model, anchor: int) -> int:
    """Filler of a short last chunk: the config's ``pad_token_id``, else the anchor (padding is masked
    out of attention either way)."""
    pad = model.config.pad_token_id
    return anchor if pad is None else pad


def cut_chunks(n_tokens: int, chunk_size: int) -> list:
    """``(start, size)`` of consecutive chunks of ``chunk_size`` tokens (the last may be shorter).

    Raises:
        ValueError: ``n_tokens < 1`` (empty context) or ``chunk_size < 1``.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if n_tokens < 1:
        raise ValueError("the context is empty: nothing to prefill (use method='prefix_cache' or 'dense')")
    return [(s, min(chunk_size, n_tokens - s)) for s in range(0, n_tokens, chunk_size)]


def sentence_end_table(model) -> torch.Tensor:
    """``[V]`` bool: which token ids end a sentence or paragraph (their text, decoded alone, ends in
    ``.``, ``!`` or ``?`` after stripping spaces and closing quotes/brackets, or holds a newline).

    Computed once per model from its tokenizer and cached on the model (one decode per vocabulary
    entry: about a second for a 150K vocabulary). Special tokens are never ends.

    Raises:
        ValueError: the model has no tokenizer (``boundary_snap`` needs one to find sentence ends).
    """
    cached = getattr(model, "_dllm_sentence_ends", None)
    if cached is not None:
        return cached
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        raise ValueError("boundary_snap > 0 needs the model's tokenizer to find sentence ends; this model has none")
    vocab = model.config.vocab_size
    special = set(getattr(tok, "all_special_ids", []) or [])
    texts = tok.batch_decode([[i] for i in range(min(vocab, len(tok)))], clean_up_tokenization_spaces=False)
    ends = torch.zeros(vocab, dtype=torch.bool)
    for i, text in enumerate(texts):
        if i in special:
            continue
        core = text.rstrip(" \t\"')]}\u201d\u2019")
        ends[i] = "\n" in text or core.endswith((".", "!", "?"))
    try:
        model._dllm_sentence_ends = ends
    except AttributeError:  # pragma: no cover - a model class that forbids new attributes
        pass
    return ends


def snapped_chunks(ends: torch.Tensor, chunk_size: int, tolerance: int) -> list:
    """``(start, size)`` of chunks of at most ``chunk_size`` tokens whose boundaries are snapped to
    sentence ends.

    Greedy from the start: a chunk that would end at ``b = start + chunk_size`` (before the end of the
    context) ends instead at the largest boundary ``e`` in ``b - tolerance .. b`` that follows a
    sentence-end token (token ``e - 1`` ends a sentence), if there is one, else at ``b``. ``tolerance=0``
    gives :func:`cut_chunks` exactly.

    Args:
        ends: ``[L]`` bool, token ``i`` ends a sentence (:func:`sentence_end_table` indexed by the context).
        chunk_size: C >= 1.
        tolerance: 0 <= tol < C, tokens a boundary may move back.

    Raises:
        ValueError: an empty context, ``chunk_size < 1`` or a tolerance outside ``[0, C)``.
    """
    n = int(ends.numel())
    if tolerance == 0:
        return cut_chunks(n, chunk_size)
    if not 0 <= tolerance < chunk_size:
        raise ValueError(f"tolerance must be in [0, chunk_size={chunk_size}), got {tolerance}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if n < 1:
        raise ValueError("the context is empty: nothing to prefill (use method='prefix_cache' or 'dense')")
    after = (torch.nonzero(ends.cpu(), as_tuple=False).flatten() + 1).tolist()  # boundaries allowed after an end
    spans, s = [], 0
    while s < n:
        b = s + chunk_size
        if b >= n:
            spans.append((s, n - s))
            break
        i = bisect.bisect_right(after, b) - 1  # last allowed boundary <= b
        e = after[i] if i >= 0 and after[i] >= b - tolerance and after[i] > s else b
        spans.append((s, e - s))
        s = e
    return spans


def chunk_spans(model, context: torch.Tensor, chunk_size: int, boundary_snap: int = 0) -> list:
    """``(start, size)`` of the chunks ``context [L]`` is cut into: :func:`cut_chunks` when
    ``boundary_snap`` is 0, else :func:`snapped_chunks` with the model's sentence ends."""
    if boundary_snap == 0:
        return cut_chunks(context.numel(), chunk_size)
    table = sentence_end_table(model)
    return snapped_chunks(table[context.cpu()], chunk_size, boundary_snap)


def chunk_char_spans(model, context: str, cfg) -> list | None:
    """Where each chunk lies in the context text: ``[(start, end)]`` character offsets (end exclusive) of the
    chunks ``cfg`` (a :class:`PrefillingConfig`: its ``chunk_size`` and ``boundary_snap``) cuts ``context`` into,
    in chunk order, so ``spans[j]`` for ``j`` in ``stats.extra["selected_chunks"]`` is a kept chunk's text.

    From the tokenizer's offset mapping of the one tokenization of ``context``
    (:func:`dllm.model.tokenization.token_offsets`, the ids :func:`dllm.encode_text` gives).

    Returns:
        the spans, or None when the tokenizer reports no offsets (a slow tokenizer) or the text has no token.

    Raises:
        ValueError: a chunk size or snap that :func:`cut_chunks` / :func:`snapped_chunks` refuse.
    """
    from dllm.model.tokenization import encode_text, token_offsets

    offsets = token_offsets(model, context)
    if offsets is None or offsets.shape[0] == 0:
        return None
    ids = encode_text(model, context)
    return [
        (int(offsets[s, 0]), int(offsets[s + n - 1, 1]))
        for s, n in chunk_spans(model, ids, cfg.chunk_size, cfg.boundary_snap)
    ]


def count_chunks(model, context: torch.Tensor, cfg) -> int:
    """N, the chunks ``context`` is cut into under ``cfg`` (a :class:`PrefillingConfig`): the snapped ones
    when ``cfg.boundary_snap`` (what :meth:`PrefillingConfig.for_chunks` fits K against).

    Args:
        model: the loaded model (its tokenizer finds the sentence ends a snapped boundary moves to).
        context: ``[L]`` int64 token ids of the context, L >= 1.

    Returns:
        the chunk count, ``ceil(L / C)`` with fixed chunks, at least that with snapped ones.

    Raises:
        ValueError: an empty context, or a chunk size or snap that :func:`cut_chunks` / :func:`snapped_chunks` refuse.
    """
    return len(chunk_spans(model, context, cfg.chunk_size, cfg.boundary_snap))


def encode_segment(model, ids: torch.Tensor, positions: torch.Tensor):
    """Encode one static segment alone; returns per-layer K/V ``[L, Hkv, D]``."""
    out = model(ids[None], positions, logits_start=ids.numel(), return_kv=True)
    return [k[0] for k in out.k], [v[0] for v in out.v]


def encode_chunks(
    model,
    context: torch.Tensor,
    chunk_size: int,
    *,
    bos_id: int,
    pad_id: int,
    batch: int | None = None,
    progress: bool = False,
    boundary_snap: int = 0,
) -> tuple[ChunkCache, int]:
    """Chunked prefill of ``context [L_ctx]``.

    Args:
        model: the dLLM.
        context: ``[L_ctx]`` int64 token ids on the model's device.
        chunk_size: C.
        bos_id: anchor token put before every chunk.
        pad_id: filler of the last, shorter chunk (masked out of attention).
        batch: chunks per forward (None = as many as :func:`~dllm.prefilling.memory.default_prefill_batch`
            fits in a share of the device's free memory: all at once for documents that fit).
        progress: tqdm bar over chunk batches.
        boundary_snap: tolerance of :func:`snapped_chunks` (0 = fixed chunks of C tokens).

    Returns:
        (:class:`ChunkCache`, number of model forwards).

    Raises:
        ValueError: empty context, chunk_size < 1.
    """
    caches, nfe, _per_row = encode_chunks_rows(
        model,
        [context],
        chunk_size,
        bos_id=bos_id,
        pad_id=pad_id,
        batch=batch,
        progress=progress,
        boundary_snap=boundary_snap,
    )
    return caches[0], nfe


def encode_chunks_as_configured(model, contexts: list, cfg, anchor: int, *, progress: bool = False):
    """:func:`encode_chunks_rows` with the chunking of a :class:`~dllm.prefilling.PrefillingConfig`.

    The one encoding that fresh prefilling runs and document caches share (chunk size, boundary snapping,
    forward batch, anchor and padding alike), so that answers from a cached document equal fresh answers.

    Args:
        model: the dLLM.
        contexts: B ``[L_ctx_b]`` int64 token id tensors on the model's device.
        cfg: the configuration (its ``chunk_size``, ``boundary_snap`` and ``prefill_batch`` are read).
        anchor: the token put before every chunk (:func:`~dllm.prefilling.config.resolve_anchor_token_id`);
            a short last chunk is padded with :func:`pad_token_id`.
        progress: tqdm bar over chunk batches.

    Returns:
        As :func:`encode_chunks_rows`: (B chunk caches, model forwards, B per-row forward counts).

    Raises:
        ValueError: as :func:`encode_chunks_rows`.
    """
    return encode_chunks_rows(
        model,
        contexts,
        cfg.chunk_size,
        bos_id=anchor,
        pad_id=pad_token_id(model, anchor),
        batch=cfg.prefill_batch,
        progress=progress,
        boundary_snap=cfg.boundary_snap,
    )


def encode_chunks_rows(
    model,
    contexts: list,
    chunk_size: int,
    *,
    bos_id: int,
    pad_id: int,
    batch: int | None = None,
    progress: bool = False,
    boundary_snap: int = 0,
    spans: list | None = None,
) -> tuple[list, int, list]:
    """Chunked prefill of several contexts at once: their chunks stacked along N in shared forwards.

    Contexts whose chunks have the same padded length ``T = min(C, L_ctx) + 1`` (every context of
    at least C tokens) are encoded together, ``batch`` chunks per forward; each row's
    :class:`ChunkCache` is then a view of the group's encoding (:meth:`ChunkCache.rows`). A chunk's
    K/V are those it gets encoded alone (attention is within the chunk; grouping by T keeps the
    padding, and so the attention arithmetic, of a row's own run).

    Args:
        model: the dLLM.
        contexts: B ``[L_ctx_b]`` int64 token id tensors on the model's device.
        chunk_size, bos_id, pad_id, batch, progress, boundary_snap: as :func:`encode_chunks` (``batch``
            counts chunks of all rows).
        spans: per row, the ``(start, size)`` chunks to encode (sizes <= C; default: :func:`chunk_spans` of the
            row under ``chunk_size`` and ``boundary_snap``): :func:`encode_candidates` encodes a subset.

    Returns:
        (B chunk caches, the number of model forwards, B forward counts: the forwards each row's
        chunks took part in; a forward shared by rows counts for each).

    Raises:
        ValueError: an empty context, chunk_size < 1, or a chunk and its anchor (``chunk_size + 1``
            positions) longer than the model's trained positions (``max_position_embeddings``): its
            keys would be out of distribution, silently.
    """
    limit = getattr(getattr(model, "config", None), "trained_positions", None)
    if limit and chunk_size + 1 > limit:
        raise ValueError(
            f"chunk_size={chunk_size}: a chunk and its BOS anchor take {chunk_size + 1} positions, more than the "
            f"model's {limit} trained positions (max_position_embeddings, with its rope_scaling factor)"
        )
    if spans is None:
        spans = [chunk_spans(model, c, chunk_size, boundary_snap) for c in contexts]
    groups: dict[int, list[int]] = {}
    for row, c in enumerate(contexts):
        groups.setdefault(min(chunk_size, c.numel()) + 1, []).append(row)
    caches, per_row, nfe = [None] * len(contexts), [0] * len(contexts), 0
    for t, rows in groups.items():
        offsets, n = [], 0
        for row in rows:
            offsets.append(n)
            n += len(spans[row])
        dev = contexts[rows[0]].device
        ids = torch.full((n, t), pad_id, dtype=torch.long, device=dev)
        ids[:, 0] = bos_id
        lens_l, starts = [], []
        i = 0
        for row in rows:
            for s, c in spans[row]:
                ids[i, 1 : 1 + c] = contexts[row][s : s + c]
                lens_l.append(c + 1)
                starts.append(s)
                i += 1
        lens = torch.tensor(lens_l, dtype=torch.int32, device=dev)
        valid = torch.arange(t, device=dev)[None, :] < lens[:, None]  # [N, T]
        pos = torch.arange(t, device=dev)
        step = batch or default_prefill_batch(model, t, n)
        k = v = None  # per layer [n, t, Hkv, D], allocated once: no concatenation copy of the whole document
        for lo in tqdm(range(0, n, step), desc="chunked prefill", unit="batch", disable=not progress, leave=False):
            hi = min(n, lo + step)
            mask = None if bool(valid[lo:hi].all()) else valid[lo:hi]
            out = model(ids[lo:hi], pos, attention_mask=mask, logits_start=t, return_kv=True)
            nfe += 1
            for row, off in zip(rows, offsets):
                if off < hi and lo < off + len(spans[row]):
                    per_row[row] += 1
            if hi - lo == n:  # one forward: its outputs are the result
                k, v = list(out.k), list(out.v)
                break
            if k is None:
                k = [x.new_empty((n, *x.shape[1:])) for x in out.k]
                v = [x.new_empty((n, *x.shape[1:])) for x in out.v]
            for layer, (kb, vb) in enumerate(zip(out.k, out.v)):
                k[layer][lo:hi] = kb
                v[layer][lo:hi] = vb
            del out
        whole = ChunkCache(k, v, lens, starts, ids)
        for row, off in zip(rows, offsets):
            caches[row] = whole if len(rows) == 1 else whole.rows(off, len(spans[row]))
    return caches, nfe, per_row


def encode_candidates(model, context: torch.Tensor, cfg, anchor: int, layer: int, pick) -> tuple:
    """Chunked prefill of a fresh context in two passes: every chunk only up to the keys of ``layer``, then the
    chunks ``pick`` chooses from those keys in full (our extension of Prefilling-dLLM's chunked prefill, arXiv
    2606.10537, which encodes every chunk in full: for one question only the first stage's candidates need
    their K/V, and layer 0's keys are a projection of the token embeddings).

    The chunks are cut, anchored, padded and batched as :func:`encode_chunks_as_configured` cuts them, so the
    candidates' K/V are those of a full encoding (up to the last bits of a differently batched product).

    Args:
        model: the dLLM.
        context: ``[L_ctx]`` int64 token ids on the model's device, L_ctx >= 1.
        cfg: the :class:`~dllm.prefilling.PrefillingConfig` (``chunk_size``, ``boundary_snap``, ``prefill_batch``).
        anchor: the token put before every chunk.
        layer: the layer whose keys the first pass computes (:meth:`DiffusionLM.layer_keys`).
        pick: ``fn(keys: ChunkCache) -> list[int]``: the candidates (ascending chunk indices), from a cache
            whose ``k[layer]`` alone is set (``k`` of the other layers None, ``v`` empty).

    Returns:
        ``(ChunkCache, model forwards, candidates)``: the cache has all N chunks (``lens``, ``starts``, ``ids``
        of every chunk); only the candidates' K/V rows are encoded, the others are zeros and must not be read.

    Raises:
        ValueError: as :func:`encode_chunks_rows`; ``layer`` outside the model's layers; ``pick`` returning
            indices outside ``[0, N)`` or none.
    """
    limit = getattr(getattr(model, "config", None), "trained_positions", None)
    if limit and cfg.chunk_size + 1 > limit:
        raise ValueError(
            f"chunk_size={cfg.chunk_size}: a chunk and its BOS anchor take {cfg.chunk_size + 1} positions, more "
            f"than the model's {limit} trained positions (max_position_embeddings, with its rope_scaling factor)"
        )
    spans = chunk_spans(model, context, cfg.chunk_size, cfg.boundary_snap)
    n, t, dev = len(spans), min(cfg.chunk_size, context.numel()) + 1, context.device
    ids = torch.full((n, t), pad_token_id(model, anchor), dtype=torch.long, device=dev)
    ids[:, 0] = anchor
    for i, (s, c) in enumerate(spans):
        ids[i, 1 : 1 + c] = context[s : s + c]
    lens = torch.tensor([c + 1 for _s, c in spans], dtype=torch.int32, device=dev)
    valid = torch.arange(t, device=dev)[None, :] < lens[:, None]
    pos = torch.arange(t, device=dev)
    step = cfg.prefill_batch or default_prefill_batch(model, t, n)
    n_layers = model.config.num_layers
    keys, nfe = None, 0
    for lo in range(0, n, step):  # pass 1: the first-stage layer's keys of every chunk
        hi = min(n, lo + step)
        mask = None if bool(valid[lo:hi].all()) else valid[lo:hi]
        kb = model.layer_keys(ids[lo:hi], pos, layer, attention_mask=mask)
        nfe += 1
        if keys is None:
            keys = kb.new_empty((n, *kb.shape[1:]))
        keys[lo:hi] = kb
    probe = [None] * n_layers
    probe[layer % n_layers] = keys
    starts = [s for s, _c in spans]
    cands = sorted(set(pick(ChunkCache(probe, [], lens, starts, ids))))
    if not cands or cands[0] < 0 or cands[-1] >= n:
        raise ValueError(f"pick returned no candidates or indices outside [0, {n}): {cands[:8]}")
    del keys, probe
    sub, sub_nfe, _rows = encode_chunks_rows(
        model, [context], cfg.chunk_size, bos_id=anchor, pad_id=pad_token_id(model, anchor),
        batch=cfg.prefill_batch, boundary_snap=0, spans=[[spans[j] for j in cands]],
    )  # fmt: skip
    sub = sub[0]
    idx = torch.tensor(cands, dtype=torch.long, device=dev)
    k = [x.new_zeros((n, *x.shape[1:])).index_copy_(0, idx, x) for x in sub.k]
    v = [x.new_zeros((n, *x.shape[1:])).index_copy_(0, idx, x) for x in sub.v]
    return ChunkCache(k, v, lens, starts, ids), nfe + sub_nfe, cands
