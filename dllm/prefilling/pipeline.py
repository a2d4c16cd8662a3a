"""Prefilling-dLLM end to end (arXiv 2606.10537), in the order it runs.

(Over 600 lines on purpose: the method's three steps and the batch of requests they serve read top to bottom
in one file; the parts that stand alone live beside it: chunks, scoring, selection, document, reselect.)

``dllm.generate(model, method="prefilling", prompt=PromptParts(...), prefilling=PrefillingConfig())``
lands in :func:`build_prefilling_policy`, which runs three named steps and returns the decode policy:

1. :func:`prefill`: cut the context into chunks and encode each alone after a BOS anchor (or take
   them from a :class:`~dllm.prefilling.document.DocumentCache`), and encode the prefix.
2. :func:`score_and_select`: draft pseudo-labels without the context, score every chunk by how
   well it predicts the query and the draft, keep the top-K.
3. :func:`build_cache`: move the kept chunks to their decode positions (rotate their keys), keep
   the top-B tokens of each if asked, and pack prefix + chunks into one static segment table.

The policy (:class:`dllm.decode.policies.PrefillingPolicy`) then recomputes only the live block
(query + response) at every denoising step; its attention runs over the static segments plus
itself through ``triton_kernels.split_s_attention`` (split-S partials + LSE merge).

Each step returns a typed result that holds one batch row; the static cache is packed with
:meth:`StaticKVCache.from_rows`, which takes one list of segments per row.

Batched requests (``prompt=[PromptParts, ...]``): the steps run once for all rows. The chunked
prefill stacks the rows' chunks along N (:func:`~dllm.prefilling.chunks.encode_chunks_rows`),
identical prefixes and drafts are encoded once (a shared prefix is also stored once: one slot that
every row having it names in the segment table), chunk scoring stacks every row's chunks with that
row's scoring tokens (:func:`~dllm.prefilling.scoring.score_chunks_rows`), and each row keeps its
own chunks in the segment table; the denoising loop then runs once over live blocks padded to the
longest row (``live_lens``). Each row's tokens equal its own run (greedy decoding).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import triton_kernels
from dllm.decode.policies import PrefillingPolicy
from dllm.model.devices import check_ids_for_model
from dllm.model.kv_cache import Segment, StaticKVCache
from dllm.prefilling.chunks import (
    ChunkCache,
    chunk_spans,
    count_chunks,
    encode_candidates,
    encode_chunks_as_configured,
    encode_segment,
)
from dllm.prefilling.config import PrefillingConfig, TopKError, checkpoint_config, resolve_anchor_token_id
from dllm.prefilling.document import DocumentCache
from dllm.prefilling.lexical import chunk_lexical_scores, fuse_scores, lexical_ngram
from dllm.prefilling.positions import chunk_offsets
from dllm.prefilling.prompt import PromptParts
from dllm.prefilling.scoring import ChunkScores, ScoringRow, draft_pseudo_labels_rows, score_chunks_rows
from dllm.prefilling.selection import first_stage_candidates, first_stage_scores, kept_chunks, top_chunks


@dataclass
class Prefill:
    """Step 1: what is encoded before any question-dependent work.

    Attributes:
        chunks: the chunk caches (per layer ``[N, C+1, Hkv, D]``), fresh or from a document.
        prefix: the prefix as its own segment (independent cache mode, non-empty prefix), else None.
        anchor_token_id: the BOS anchor before every chunk, and ``anchor_source``: where it came
            from (:func:`~dllm.prefilling.config.resolve_anchor_token_id`).
        from_document: the chunks came from a :class:`DocumentCache` (none encoded here).
        nfe: model forwards spent (in a batch: the shared forwards this row's chunks and prefix took part in).
        candidates: the chunks a first stage chose while a fresh context was encoded in two passes
            (:func:`~dllm.prefilling.chunks.encode_candidates`: only they have K/V; ascending), else None.
    """

    chunks: ChunkCache
    prefix: Segment | None
    anchor_token_id: int
    anchor_source: str
    from_document: bool
    nfe: int
    candidates: list | None = None


@dataclass
class Selection:
    """Step 2: which chunks are kept, and why.

    Attributes:
        kept: kept chunk indices, ascending.
        scores: every chunk's scores (None when nothing had to be scored: K = N and no token budget).
        pseudo_labels: the confirmed draft tokens the chunks were scored against, or None.
        nfe: model forwards spent (draft + scoring passes; in a batch: one draft and the batch's scoring passes).
    """

    kept: list[int]
    scores: ChunkScores | None
    pseudo_labels: list[int] | None
    nfe: int

    def write_stats(self, extra: dict, spans: list) -> None:
        """Put this selection's entries of ``stats.extra`` into ``extra`` (a request's, or the sharded run's).

        ``pseudo_labels`` (when drafted), ``selected_chunks`` and ``selected_chunk_tokens`` (each kept chunk's
        ``[start, end)`` in context tokens, from ``spans``: ``(start, size)`` of every chunk; characters:
        :func:`dllm.prefilling.chunk_char_spans`); when chunks were scored, the kept chunks'
        ``chunk_scores``, the score terms that were computed (``s_I``, ``s_P``, ``s_C``, lexical ``s_L``; one not is
        removed from ``extra``), ``all_chunk_scores`` (None for the chunks a first stage left out, which were
        not scored) and then ``candidate_chunks``.
        """
        if self.pseudo_labels is not None:
            extra["pseudo_labels"] = self.pseudo_labels
        extra["selected_chunks"] = self.kept
        extra["selected_chunk_tokens"] = [[spans[j][0], spans[j][0] + spans[j][1]] for j in self.kept]
        if self.scores is None:
            return
        s = self.scores
        extra["chunk_scores"] = [round(float(s.total[j]), 4) for j in self.kept]
        for name, term in (
            ("s_I", s.self_info),
            ("s_P", s.pseudo_label),
            ("s_C", s.answer_confidence),
            ("s_L", s.lexical),
        ):
            if term is not None:
                extra[name] = [round(float(term[j]), 4) for j in self.kept]
            else:
                extra.pop(name, None)
        extra["all_chunk_scores"] = [round(float(x), 4) for x in s.total.tolist()]
        if s.candidates is not None:
            extra["all_chunk_scores"] = [None if x == float("-inf") else x for x in extra["all_chunk_scores"]]
            extra["candidate_chunks"] = s.candidates


@dataclass
class RowCache:
    """Step 3: one row's static segments at their decode positions.

    Attributes:
        segments: prefix (if any), then the kept chunks in order (top-B gathered if asked).
        query_start: RoPE position of the first query token.
        nfe: model forwards spent (joint mode re-encodes once).
    """

    segments: list[Segment]
    query_start: int
    nfe: int


@dataclass
class RowSetup:
    """What the three steps made of one request (one batch row).

    Attributes:
        parts: the checked prompt parts.
        prefill, selection, row: the results of the three steps for this row.
    """

    parts: PromptParts
    prefill: Prefill
    selection: Selection
    row: RowCache

    def stats(self, cached_tokens: int) -> dict:
        """This row's ``stats.extra``: ``num_chunks``, ``anchor_token_id`` and ``anchor_source``,
        ``pseudo_labels``, ``selected_chunks``, ``selected_chunk_tokens``, the kept chunks' ``chunk_scores`` and
        the score terms that were computed (``s_I``, ``s_P``, ``s_C``), ``all_chunk_scores``, ``cached_tokens``,
        ``document`` (answered from a document)."""
        sel, pre = self.selection, self.prefill
        extra = {
            "num_chunks": pre.chunks.num_chunks,
            "anchor_token_id": pre.anchor_token_id,
            "anchor_source": pre.anchor_source,
        }
        chunks = pre.chunks  # lens count each chunk's BOS anchor
        sel.write_stats(extra, [(start, n - 1) for start, n in zip(chunks.starts, chunks.lens.tolist())])
        extra["cached_tokens"] = cached_tokens
        if pre.from_document:
            extra["document"] = True
        return extra


def _first_row(name: str, doc: str) -> property:
    """``PrefillingSetup.<name>``: ``rows[0].<name>``, read-only (four such views, one definition)."""
    return property(lambda self: getattr(self.rows[0], name), doc=doc)


@dataclass
class PrefillingSetup:
    """Everything :func:`build_prefilling_policy` did, and the policy it built.

    Attributes:
        rows: one :class:`RowSetup` per request (one for a single prompt).
        cache: the packed static cache the policy decodes over (one segment-table row per request).
        policy: the decode policy (its ``nfe`` starts at the forwards spent here).
        batched: the prompt was a list of requests (``stats()`` then reports per row).
        cfg: the prefilling configuration the rows were selected with (the checkpoint's when none was given).
    """

    rows: list
    cache: StaticKVCache
    policy: PrefillingPolicy
    batched: bool = False
    cfg: PrefillingConfig | None = None

    # the single-request view: the first row's
    parts = _first_row("parts", "The first row's :class:`PromptParts`.")
    prefill = _first_row("prefill", "The first row's :class:`Prefill`.")
    selection = _first_row("selection", "The first row's :class:`Selection`.")
    row = _first_row("row", "The first row's :class:`RowCache`.")

    def row_stats(self) -> list:
        """Each row's ``stats.extra`` (:meth:`RowSetup.stats`)."""
        cached = self.cache.tokens_per_row().tolist()
        return [r.stats(int(n)) for r, n in zip(self.rows, cached)]

    def stats(self) -> dict:
        """``stats.extra`` of the generation: a single request's :meth:`RowSetup.stats`; for a batch,
        ``batch_size`` (the rows' own stats are :meth:`row_stats`)."""
        if self.batched:
            return {"batch_size": len(self.rows)}
        return self.row_stats()[0]


# --- inputs ---------------------------------------------------------------------------------------


def check_parts(model, parts: PromptParts, document: DocumentCache | None) -> PromptParts:
    """Validate prompt parts (1-D int ids on the model's device, no mask id) and return them as int64.

    Raises:
        TypeError: not a PromptParts, non-integer ids.
        ValueError: wrong rank or device, the mask id, an empty query, a missing context without a
            document, or a context together with a document.
    """
    if not isinstance(parts, PromptParts):
        raise TypeError(f"prompt must be a PromptParts, got {type(parts).__name__}")
    if document is not None and parts.context is not None:
        raise ValueError("pass the context either in prompt.context or as document=, not both")
    if document is None and parts.context is None:
        raise ValueError("prompt.context is None: pass the context, or document= a DocumentCache")
    out = []
    for name in ("prefix", "context", "query"):
        t = getattr(parts, name)
        if t is None:
            out.append(None)
            continue
        if not torch.is_tensor(t) or t.dim() != 1:
            raise ValueError(f"prompt.{name} must be a 1-D tensor of token ids")
        if t.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"prompt.{name} must hold int64 token ids, got {t.dtype}")
        check_ids_for_model(model, t, f"prompt.{name} is", f"prompt.{name} contains", f"prompt.{name}")
        out.append(t.to(model.device).long())
    parts = PromptParts(*out)
    if parts.context is not None and parts.context.numel() == 0:
        raise ValueError("prompt.context is empty: nothing to prefill (use method='prefix_cache' or 'dense')")
    if parts.query.numel() == 0:
        raise ValueError("prompt.query is empty: prefilling scores chunks by how well they predict the query")
    return parts


def parts_from_ids(model, input_ids, cfg: PrefillingConfig, bos: int) -> PromptParts:
    """Documented fallback when only ``input_ids`` are given: the anchor ``bos`` (if first) = prefix,
    the last ``query_window`` (default 64) tokens = query, the rest = context.

    Raises:
        ValueError: more than one row, or too few tokens to split off the query.
    """
    ids = input_ids[0] if input_ids.dim() == 2 else input_ids
    if input_ids.dim() == 2 and input_ids.shape[0] != 1:
        raise ValueError("prefilling decodes one prompt at a time (batch size 1)")
    n_pre = 1 if bos is not None and ids.numel() and int(ids[0]) == bos else 0
    w = cfg.query_window or 64
    if ids.numel() - n_pre <= w:
        raise ValueError(f"a prompt of {ids.numel()} tokens is too short to split off a {w}-token query")
    return PromptParts(ids[:n_pre], ids[n_pre:-w], ids[-w:])


def check_top_k(cfg: PrefillingConfig, n_chunks: int, n_tokens: int) -> int:
    """K, checked against the N chunks (snapped ones with ``boundary_snap``) before any model work.

    Raises:
        TopKError: K > N (:meth:`PrefillingConfig.for_chunks` with ``explicit``), the message naming the
            context's tokens and how to keep every chunk.
    """
    try:
        cfg.for_chunks(n_chunks, explicit=True)
    except TopKError as exc:
        exc.args = (str(exc).replace("of this context", f"of this {n_tokens}-token context", 1),)
        raise
    return n_chunks if cfg.top_k is None else cfg.top_k


# --- step 1: prefill ------------------------------------------------------------------------------


def prefill(
    model, parts: PromptParts, cfg: PrefillingConfig, *, document: DocumentCache | None = None, progress=False
) -> Prefill:
    """Chunked prefill of the context (skipped with a document) and the prefix segment.

    The prefix is encoded alone at positions ``0..P-1`` in independent mode; joint mode encodes it
    later together with the kept chunks (:func:`build_cache`).
    """
    rows, _nfe = prefill_rows(model, [parts], cfg, documents=[document], progress=progress)
    return rows[0]


def prefill_rows(model, parts: list, cfg: PrefillingConfig, *, documents: list, progress=False):
    """:func:`prefill` for B requests at once.

    The rows without a document have their chunks encoded in shared forwards (stacked along N,
    :func:`~dllm.prefilling.chunks.encode_chunks_rows`); rows with the same prefix share its segment.

    Args:
        model: the dLLM.
        parts: B checked :class:`PromptParts`.
        cfg: the configuration.
        documents: B :class:`DocumentCache` or None (the row's context is in its parts).
        progress: tqdm bar over the chunk batches.

    Returns:
        (B :class:`Prefill`, the number of model forwards run).
    """
    bos, source = resolve_anchor_token_id(model.config, model.tokenizer, cfg)
    fresh = [b for b, doc in enumerate(documents) if doc is None]
    chunks, nfe_row, cands = [None] * len(parts), [0] * len(parts), [None] * len(parts)
    nfe = 0
    for b in [b for b in fresh if two_pass_candidates(model, parts[b], cfg) is not None]:
        chunks[b], nfe_row[b], cands[b] = encode_candidates(
            model,
            parts[b].context,
            cfg,
            bos,
            cfg.candidate_layer,
            lambda keys, b=b: _first_stage(model, parts[b], keys, cfg),
        )
        nfe += nfe_row[b]
        fresh.remove(b)
    if fresh:
        contexts = [parts[b].context for b in fresh]
        caches, nfe_all, counts = encode_chunks_as_configured(model, contexts, cfg, bos, progress=progress)
        nfe += nfe_all
        for b, cache, count in zip(fresh, caches, counts):
            chunks[b], nfe_row[b] = cache, count
    for b, doc in enumerate(documents):
        if doc is not None:
            chunks[b] = doc.chunks
    # prefix token ids -> its segment: encoded once, and the same object in every row that has it, so
    # StaticKVCache.from_rows stores it in one slot that all those rows name
    prefixes: dict[tuple, Segment] = {}
    out = []
    for b, pp in enumerate(parts):
        prefix = None
        p = pp.prefix.numel()
        if p and cfg.cache_mode == "independent":
            key = tuple(pp.prefix.tolist())
            if key not in prefixes:
                k, v = encode_segment(model, pp.prefix, torch.arange(p, device=model.device))
                prefixes[key] = Segment(k, v, p)
                nfe += 1
            prefix = prefixes[key]
            nfe_row[b] += 1
        out.append(Prefill(chunks[b], prefix, bos, source, documents[b] is not None, nfe_row[b], cands[b]))
    return out, nfe


def two_pass_candidates(model, parts: PromptParts, cfg: PrefillingConfig) -> int | None:
    """The candidate count when a fresh context is encoded in two passes (only the first stage's candidates
    in full, :func:`~dllm.prefilling.chunks.encode_candidates`), else None: a first stage engaged
    (:meth:`PrefillingConfig.candidate_count` at the context's chunk count and K) in one layer
    (``candidate_layer`` set; with all layers, every layer's keys of every chunk are needed anyway)."""
    if cfg.candidates is None or cfg.candidate_layer is None or cfg.top_k is None:
        return None
    n = len(chunk_spans(model, parts.context, cfg.chunk_size, cfg.boundary_snap))
    k = min(cfg.top_k, n)
    return cfg.candidate_count(n, k) if k < n else None


def _first_stage(model, parts: PromptParts, chunks: ChunkCache, cfg: PrefillingConfig) -> list:
    """The candidates of :func:`score_and_select_rows`'s first stage (same window, count and ties)."""
    n = chunks.num_chunks
    window = parts.query if cfg.query_window is None else parts.query[-cfg.query_window :]
    first = first_stage_scores(model, chunks, window, cfg.draft_tokens, cfg.candidate_layer)
    k = min(cfg.top_k, n)
    cands = first_stage_candidates(first, cfg.candidate_count(n, k), cfg.neighbours_of(k))
    return with_lexical_candidates(cands, lexical_of(model, parts, chunks, cfg), k)


def lexical_of(model, parts: PromptParts, chunks: ChunkCache, cfg: PrefillingConfig) -> torch.Tensor | None:
    """``[N]`` fp32 lexical scores of the chunks for the row's query (:func:`~dllm.prefilling.lexical.
    chunk_lexical_scores`, n from the tokenizer), or None when ``cfg.lexical_weight`` is 0 (off)."""
    if not cfg.lexical_weight:
        return None
    return chunk_lexical_scores(parts.query, chunks, lexical_ngram(model))


def with_lexical_candidates(cands: list, lexical: torch.Tensor | None, k: int) -> list:
    """A first stage's candidates plus the ``k`` chunks of best lexical score (ascending; unchanged without a
    lexical term): a chunk that holds the query's words is scored even where the first stage ranks it low."""
    return cands if lexical is None else sorted(set(cands) | set(top_chunks(lexical, k)))


# --- step 2: score and select ---------------------------------------------------------------------


def score_and_select(model, parts: PromptParts, chunks: ChunkCache, cfg: PrefillingConfig) -> Selection:
    """Keep the top-K chunks by predictive score; scores are also computed when a token budget
    needs the per-token attention mass (independent mode)."""
    rows, _nfe = score_and_select_rows(model, [parts], [chunks], cfg)
    return rows[0]


def score_and_select_rows(model, parts: list, chunks: list, cfg: PrefillingConfig, *, candidates=None):
    """:func:`score_and_select` for B requests: one draft per distinct ``prefix + query``, the
    chunks of all rows scored in shared forwards (:func:`~dllm.prefilling.scoring.score_chunks_rows`).

    ``candidates``: per row, the first stage's candidates already chosen (a two-pass fresh prefill,
    :attr:`Prefill.candidates`; only they are scored, no first stage is run here) or None.

    Returns:
        (B :class:`Selection`, the number of model forwards run).
    """
    need_tokens = cfg.token_budget is not None and cfg.cache_mode == "independent"
    ks = [c.num_chunks if cfg.top_k is None else min(cfg.top_k, c.num_chunks) for c in chunks]  # K > N: checked
    # adaptive K chooses between 1 and K even when K covers every chunk (top_k None or N): scored then too
    adaptive = cfg.adaptive_k is not None
    scored = [b for b, c in enumerate(chunks) if ks[b] < c.num_chunks or need_tokens or (adaptive and c.num_chunks > 1)]
    out = [Selection(list(range(c.num_chunks)), None, None, 0) for c in chunks]
    if not scored:
        return out, 0
    drafts, nfe = draft_pseudo_labels_rows(
        model,
        [parts[b].prefix for b in scored],
        [parts[b].query for b in scored],
        cfg.draft_tokens,
        cfg.draft_threshold,
    )
    score_rows, cands = [], {}
    lex = {b: lexical_of(model, parts[b], chunks[b], cfg) for b in scored}  # None: no lexical term
    for b, (labels, confirmed) in zip(scored, drafts):
        window = parts[b].query if cfg.query_window is None else parts[b].query[-cfg.query_window :]
        rows_chunks = chunks[b]
        n_cand = cfg.candidate_count(chunks[b].num_chunks, ks[b]) if ks[b] < chunks[b].num_chunks else None
        if candidates is not None and candidates[b] is not None:  # chosen in a two-pass prefill
            cands[b] = candidates[b]
            nfe += 1  # its forward ran during the prefill; counted here with the selection, as below
            rows_chunks = chunks[b].select(cands[b])
        elif n_cand is not None:
            # first stage: only the n_cand chunks it ranks best get the predictive score
            first = first_stage_scores(model, chunks[b], window, cfg.draft_tokens, cfg.candidate_layer)
            nfe += 1
            cands[b] = first_stage_candidates(first, n_cand, cfg.neighbours_of(ks[b]))
            cands[b] = with_lexical_candidates(cands[b], lex[b], ks[b])
            rows_chunks = chunks[b].select(cands[b])
        score_rows.append(ScoringRow(rows_chunks, window, labels, confirmed))
    scores, n_scoring = score_chunks_rows(
        model,
        score_rows,
        mode=cfg.score_mode,
        terms=cfg.score_terms,
        token_scores=need_tokens,
        batch=cfg.prefill_batch,
    )
    nfe += n_scoring
    for b, sc, (labels, confirmed) in zip(scored, scores, drafts):
        n = chunks[b].num_chunks
        if b in cands:
            sc = sc.scatter(cands[b], n)
        if lex[b] is not None:
            sc.lexical = lex[b]
            sc.total = fuse_scores(sc.total, lex[b], cfg.lexical_weight)
        if ks[b] < n or adaptive:
            kept = kept_chunks(sc.total, ks[b], cfg.adaptive_k, chunks[b].context_ids, cfg.redundancy_threshold)
        else:
            kept = list(range(n))
        out[b] = Selection(kept, sc, labels[confirmed].tolist(), n_scoring + 1 + (b in cands))
    return out, nfe


# --- step 3: build the static cache ---------------------------------------------------------------


def _top_b_segments(k_layers, v_layers, lens, token_scores, budget, cfg, keep_first) -> list[Segment]:
    """One segment per chunk; with a budget, its top-B tokens per (layer, KV head) in original order."""
    n = lens.numel()
    if token_scores is None or budget is None:
        return [Segment([k[i] for k in k_layers], [v[i] for v in v_layers], int(lens[i])) for i in range(n)]
    ks, vs, kept = [], [], None
    for layer in range(len(k_layers)):
        k_out, v_out, _idx, kept = triton_kernels.topb_gather(
            token_scores[layer],
            k_layers[layer],
            v_layers[layer],
            budget,
            lens=lens,
            pool_kernel=cfg.pool_kernel,
            keep_first=keep_first,
        )
        ks.append(k_out)
        vs.append(v_out)
    return [Segment([k[i] for k in ks], [v[i] for v in vs], int(kept[i])) for i in range(n)]


def _independent_row(model, parts, pre: Prefill, sel: Selection, cfg) -> RowCache:
    """The prefill's own chunk caches, keys rotated from local to decode positions."""
    chunks = pre.chunks
    starts, q_start = chunk_offsets(
        cfg.position_mode, parts.prefix.numel(), sel.kept, chunks.sizes(), cfg.chunk_size, chunk_starts=chunks.starts
    )
    idx = torch.tensor(sel.kept, device=chunks.lens.device)
    delta = torch.tensor(starts, device=idx.device)[:, None]  # the BOS anchor was cached at local position 0
    k_layers = [model.rope.rotate_keys(k.index_select(0, idx), delta) for k in chunks.k]  # the RoPE variant's
    v_layers = [v.index_select(0, idx) for v in chunks.v]
    tok = None
    if sel.scores is not None and sel.scores.token_scores is not None:
        tok = [s.index_select(0, idx) for s in sel.scores.token_scores]
    budget = None if cfg.token_budget is None else cfg.token_budget + 1  # + the BOS anchor
    segments = _top_b_segments(k_layers, v_layers, chunks.lens.index_select(0, idx), tok, budget, cfg, True)
    if pre.prefix is not None:
        segments.insert(0, pre.prefix)
    return RowCache(segments, q_start, 0)


def _joint_row(model, parts, pre: Prefill, sel: Selection, cfg, gen_length) -> RowCache:
    """Re-encode prefix + kept chunks (no anchors) + query + masks once; keep the static part."""
    chunks, kept = pre.chunks, sel.kept
    sizes = chunks.sizes()
    p = parts.prefix.numel()
    starts, q_start = chunk_offsets(
        cfg.position_mode, p, kept, sizes, cfg.chunk_size, anchors=False, chunk_starts=chunks.starts
    )
    dev = parts.query.device
    masks = torch.full((gen_length,), model.mask_token_id, dtype=torch.long, device=dev)
    ids = torch.cat([parts.prefix, *[chunks.context_ids(j).to(dev) for j in kept], parts.query, masks])
    live_len = parts.query.numel() + gen_length
    pos = torch.cat(
        [torch.arange(p, device=dev)]
        + [torch.arange(s, s + sizes[j], device=dev) for s, j in zip(starts, kept)]
        + [torch.arange(q_start, q_start + live_len, device=dev)]
    )
    n_static = ids.numel() - live_len
    token_scores = None
    hook = None
    if cfg.token_budget is not None:
        token_scores = []

        def hook(layer, q, k, v):
            # bidirectional token score: live -> static mass plus static -> live mass
            stat, live = slice(0, n_static), slice(n_static, None)
            mass, _, _ = triton_kernels.chunk_attention_scores(q[:, live], k[:, stat], None, k_extra=k[:, live])
            back = triton_kernels.chunk_row_mass(q[:, stat], k[:, stat], None, k_extra=k[:, live])
            token_scores.append((mass + back)[0])  # [Hkv, n_static]

    out = model(ids[None], pos, logits_start=ids.numel(), return_kv=True, attn_hook=hook)
    k_all = [k[0] for k in out.k]
    v_all = [v[0] for v in out.v]
    segments = [Segment([k[:p] for k in k_all], [v[:p] for v in v_all], p)] if p else []
    off = p
    for j in kept:
        sl = slice(off, off + sizes[j])
        k_c = [k[sl][None] for k in k_all]
        v_c = [v[sl][None] for v in v_all]
        tok = None if token_scores is None else [s[None, :, sl] for s in token_scores]
        lens = torch.tensor([sizes[j]], dtype=torch.int32, device=dev)
        segments.extend(_top_b_segments(k_c, v_c, lens, tok, cfg.token_budget, cfg, False))
        off += sizes[j]
    return RowCache(segments, q_start, 1)


def build_cache(model, parts: PromptParts, pre: Prefill, sel: Selection, cfg: PrefillingConfig, gen_length: int):
    """One row's static segments: ``independent`` reuses the chunk caches, ``joint`` re-encodes the
    kept chunks together (``gen_length``: the initial masks are encoded with the prompt)."""
    if cfg.cache_mode == "independent":
        return _independent_row(model, parts, pre, sel, cfg)
    return _joint_row(model, parts, pre, sel, cfg, gen_length)


# --- all steps ------------------------------------------------------------------------------------


def _documents_per_row(document, n_rows: int, batched: bool) -> list:
    """One document (or None) per row: a single document serves every row; a list gives one per row."""
    if isinstance(document, (list, tuple)):
        if not batched:
            raise TypeError("document= is a list: pass prompt= as a list of PromptParts too (one per document)")
        if len(document) != n_rows:
            raise ValueError(f"document= holds {len(document)} entries for {n_rows} prompts; give one per prompt")
        docs = list(document)
    else:
        docs = [document] * n_rows
    for i, doc in enumerate(docs):
        if doc is not None and not isinstance(doc, DocumentCache):
            where = f"document[{i}]" if isinstance(document, (list, tuple)) else "document="
            raise TypeError(f"{where} must be a DocumentCache, got {type(doc).__name__}")
    return docs


@torch.no_grad()
def build_prefilling_policy(
    model,
    input_ids,
    prompt,
    cfg: PrefillingConfig | None,
    timer,
    *,
    gen_length: int,
    document=None,
    progress: bool = False,
    cuda_graph: bool | str = False,
) -> PrefillingSetup:
    """Prefill, score and select, build the static cache; return the setup with its decode policy.

    Args:
        model: the dLLM.
        input_ids: used only when ``prompt`` is None (fallback split, see :func:`parts_from_ids`).
        prompt: :class:`PromptParts` (prefix, context, query token ids; ``context`` None with a
            document), or a list of them: a batch of requests decoded together (ragged lengths allowed).
        cfg: :class:`PrefillingConfig` (None = the checkpoint's ``prefilling_config.json``, else the
            paper's defaults: :meth:`PrefillingConfig.from_pretrained`; with a document, its chunk size).
            One configuration serves every row.
        timer: the generation's :class:`~dllm.decode.timer.PhaseTimer` (phases ``prefill`` and ``scoring``;
            ``scoring`` also holds building the cache).
        gen_length: response length L_d.
        document: a :class:`DocumentCache` holding the context's chunks (nothing re-encoded); with a
            list of prompts, one document for every row or a list with one document (or None: the
            row brings its own context) per row.
        progress: tqdm bar over the chunked prefill.
        cuda_graph: the policy replays its step's forward from a CUDA graph (``"auto"``: falling back
            to eager steps if the capture fails; see :class:`dllm.decode.policies.LiveBlockPolicy`).

    Returns:
        :class:`PrefillingSetup` (``.policy`` for the loop, ``.stats()`` / ``.row_stats()``).

    Raises:
        TypeError: bad types (config, prompt parts, documents).
        ValueError: bad prompt parts (empty context or query, mask id, device), the ``top_k`` of a
            given ``cfg`` larger than the number of chunks (snapped ones with ``boundary_snap``; with
            ``cfg=None`` the checkpoint's default K keeps every chunk of a context with fewer),
            a context together with a document, a document encoded for
            another model, dtype, chunk size or anchor, an empty prompt list, a document list of
            another length. In a batch the message names the row (``prompt[i]``).
    """
    batched = isinstance(prompt, (list, tuple))
    if batched and not prompt:
        raise ValueError("prompt= is an empty list: pass at least one PromptParts")
    n_rows = len(prompt) if batched else 1
    docs = _documents_per_row(document, n_rows, batched)
    explicit = cfg is not None  # a K the caller chose must fit; the checkpoint's default K is fitted per row
    if cfg is None:
        first = next((d for d in docs if d is not None), None)
        # a document's own chunking (its C and snap), the checkpoint's other defaults
        chunk_size, snap = (None, None) if first is None else (first.chunk_size, first.boundary_snap)
        cfg = checkpoint_config(model, chunk_size, snap)
    if not isinstance(cfg, PrefillingConfig):
        raise TypeError(f"prefilling= must be a PrefillingConfig, got {type(cfg).__name__}")
    bos, _source = resolve_anchor_token_id(model.config, model.tokenizer, cfg)  # before any model work
    if prompt is None:
        if input_ids is None:
            raise ValueError("method='prefilling' needs prompt=PromptParts(...) or input_ids")
        if docs[0] is not None:
            raise ValueError("with document= pass prompt=PromptParts(prefix, None, query)")
        prompt = parts_from_ids(model, input_ids, cfg, bos)
    prompts = list(prompt) if batched else [prompt]
    parts = []
    checked = set()  # a document shared by rows is fingerprinted once (it hashes weights)
    for i, (pp, doc) in enumerate(zip(prompts, docs)):
        try:
            parts.append(check_parts(model, pp, doc))
            if doc is not None:
                if id(doc) not in checked:
                    doc.check_model(model)
                    checked.add(id(doc))
                doc.check_config(cfg, bos)
                if explicit:
                    check_top_k(cfg, doc.num_chunks, len(doc))
            elif explicit:
                check_top_k(cfg, count_chunks(model, parts[-1].context, cfg), parts[-1].context.numel())
        except (TypeError, ValueError) as exc:
            if not batched:
                raise
            exc.args = (f"prompt[{i}]: {exc}",)  # the same exception (a TopKError keeps its attributes), named row
            raise

    with timer.phase("prefill"):
        pres, nfe_prefill = prefill_rows(model, parts, cfg, documents=docs, progress=progress)
    with timer.phase("scoring"):
        sels, nfe_scoring = score_and_select_rows(
            model, parts, [p.chunks for p in pres], cfg, candidates=[p.candidates for p in pres]
        )
        rows = [build_cache(model, pp, pre, sel, cfg, gen_length) for pp, pre, sel in zip(parts, pres, sels)]
        cache = StaticKVCache.from_rows([r.segments for r in rows])
    nfe = nfe_prefill + nfe_scoring + sum(r.nfe for r in rows)
    if batched:
        query, start = [pp.query for pp in parts], [r.query_start for r in rows]
    else:
        query, start = parts[0].query[None], rows[0].query_start
    policy = PrefillingPolicy(model, query, start, cache, gen_length, nfe, cuda_graph=cuda_graph)
    setup_rows = [RowSetup(pp, pre, sel, r) for pp, pre, sel, r in zip(parts, pres, sels, rows)]
    return PrefillingSetup(setup_rows, cache, policy, batched, cfg)
