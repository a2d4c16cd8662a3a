"""Prefilling-dLLM end to end: chunked prefill -> scoring -> two-level sparsity -> static KV decode.

``dllm.generate(model, prompt=PromptParts(...), method="prefilling", prefilling=PrefillingConfig())``
lands here (:func:`build_prefilling_policy`). The returned policy recomputes only
the live block (query + response) at every denoising step; its attention runs over
the static segments (prefix + kept chunks, possibly top-B-gathered) plus itself
through ``triton_kernels.split_s_attention`` (split-S partials + LSE merge).
"""

from __future__ import annotations

import torch

import triton_kernels
from dllm.devices import same_device
from dllm.kv_cache import StaticKVCache
from dllm.prefilling.chunks import ChunkCache, cut_chunks, encode_chunks, encode_segment
from dllm.prefilling.config import PrefillingConfig, resolve_anchor_token_id
from dllm.prefilling.positions import chunk_offsets
from dllm.prefilling.prompt import PromptParts
from dllm.prefilling.scoring import draft_pseudo_labels, score_chunks


class PrefillingPolicy:
    """Decode policy over a static cache: the live block is ``query + response``."""

    def __init__(self, model, query: torch.Tensor, query_start: int, cache: StaticKVCache, timer, nfe: int):
        self.model, self.query, self.cache, self.timer = model, query, cache, timer
        self.query_start = query_start
        self.nfe = nfe

    def start_block(self, resp, block):
        pass  # the cache is static for the whole generation

    def logits(self, resp):
        live = torch.cat([self.query[None], resp], dim=1)
        pos = torch.arange(self.query_start, self.query_start + live.shape[1], device=live.device)
        with self.timer.phase("decode"):
            out = self.model(live, pos, self.cache, logits_start=self.query.numel())
        self.nfe += 1
        return out.logits


def _check_parts(model, parts: PromptParts) -> PromptParts:
    if not isinstance(parts, PromptParts):
        raise TypeError(f"prompt must be a PromptParts, got {type(parts).__name__}")
    out = []
    for name in ("prefix", "context", "query"):
        t = getattr(parts, name)
        if not torch.is_tensor(t) or t.dim() != 1:
            raise ValueError(f"prompt.{name} must be a 1-D tensor of token ids")
        if t.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"prompt.{name} must hold int64 token ids, got {t.dtype}")
        if t.numel() and not same_device(t.device, model.device):
            raise ValueError(f"prompt.{name} is on {t.device} but the model is on {model.device}")
        if (t == model.mask_token_id).any():
            raise ValueError(f"prompt.{name} contains the mask token id {model.mask_token_id}")
        out.append(t.to(model.device).long())
    parts = PromptParts(*out)
    if parts.context.numel() == 0:
        raise ValueError("prompt.context is empty: nothing to prefill (use method='prefix_cache' or 'dense')")
    if parts.query.numel() == 0:
        raise ValueError("prompt.query is empty: prefilling scores chunks by how well they predict the query")
    return parts


def _parts_from_ids(model, input_ids, cfg: PrefillingConfig, bos: int) -> PromptParts:
    """Documented fallback when only ``input_ids`` are given: BOS (if first) = prefix, the last
    ``query_window`` (default 64) tokens = query, the rest = context."""
    ids = input_ids[0] if input_ids.dim() == 2 else input_ids
    if input_ids.dim() == 2 and input_ids.shape[0] != 1:
        raise ValueError("prefilling decodes one prompt at a time (batch size 1)")
    n_pre = 1 if bos is not None and ids.numel() and int(ids[0]) == bos else 0
    w = cfg.query_window or 64
    if ids.numel() - n_pre <= w:
        raise ValueError(f"a prompt of {ids.numel()} tokens is too short to split off a {w}-token query")
    return PromptParts(ids[:n_pre], ids[n_pre:-w], ids[-w:])


def _assemble(segments, device) -> StaticKVCache:
    """Pools ``[S, T, Hkv, D]`` per layer from a list of (k_layers, v_layers, length) segments."""
    n_layers = len(segments[0][0])
    t = max(max(length for _, _, length in segments), 1)
    lens = [length for _, _, length in segments]
    ks, vs = [], []
    for layer in range(n_layers):
        proto = segments[0][0][layer]
        shape = (len(segments), t) + tuple(proto.shape[-2:])
        kp = proto.new_zeros(shape)
        vp = proto.new_zeros(shape)
        for s, (k, v, length) in enumerate(segments):
            kp[s, :length] = k[layer][:length]
            vp[s, :length] = v[layer][:length]
        ks.append(kp)
        vs.append(vp)
    slots = torch.arange(len(segments), dtype=torch.int32, device=device)[None]
    return StaticKVCache(ks, vs, slots, torch.tensor([lens], dtype=torch.int32, device=device))


def _gather_chunks(k_layers, v_layers, lens, token_scores, budget, cfg, keep_first):
    """Top-B per (chunk, layer, KV head): per-chunk K/V lists and kept counts."""
    if token_scores is None or budget is None:
        return [([k[i] for k in k_layers], [v[i] for v in v_layers], int(lens[i])) for i in range(lens.numel())]
    ks, vs = [], []
    kept = None
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
    return [([k[i] for k in ks], [v[i] for v in vs], int(kept[i])) for i in range(lens.numel())]


def _independent_cache(model, parts, chunks: ChunkCache, kept, prefix_kv, scores, cfg):
    sizes = chunks.sizes()
    starts, q_start = chunk_offsets(cfg.position_mode, parts.prefix.numel(), kept, sizes, cfg.chunk_size)
    idx = torch.tensor(kept, device=chunks.lens.device)
    delta = torch.tensor(starts, device=idx.device)[:, None]  # the BOS anchor was cached at local position 0
    k_layers = [model.rope.rotate_keys(k.index_select(0, idx), delta) for k in chunks.k]  # RoPE variant's inv_freq
    v_layers = [v.index_select(0, idx) for v in chunks.v]
    tok = None
    if scores is not None and scores.token_scores is not None:
        tok = [s.index_select(0, idx) for s in scores.token_scores]
    budget = None if cfg.token_budget is None else cfg.token_budget + 1  # + the BOS anchor
    segments = _gather_chunks(k_layers, v_layers, chunks.lens.index_select(0, idx), tok, budget, cfg, True)
    if parts.prefix.numel():
        segments.insert(0, (prefix_kv[0], prefix_kv[1], parts.prefix.numel()))
    return _assemble(segments, idx.device), q_start


def _joint_cache(model, parts, chunks: ChunkCache, kept, cfg, gen_length):
    """Re-encode prefix + kept chunks (no anchors) + query + masks once; keep the static part."""
    sizes = chunks.sizes()
    p = parts.prefix.numel()
    starts, q_start = chunk_offsets(cfg.position_mode, p, kept, sizes, cfg.chunk_size, anchors=False)
    dev = parts.query.device
    ctx = [parts.context[chunks.starts[j] : chunks.starts[j] + sizes[j]] for j in kept]
    masks = torch.full((gen_length,), model.mask_token_id, dtype=torch.long, device=dev)
    ids = torch.cat([parts.prefix, *ctx, parts.query, masks])
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
    segments = []
    if p:
        segments.append(([k[:p] for k in k_all], [v[:p] for v in v_all], p))
    off = p
    for j in kept:
        sl = slice(off, off + sizes[j])
        k_c = [k[sl][None] for k in k_all]
        v_c = [v[sl][None] for v in v_all]
        tok = None if token_scores is None else [s[None, :, sl] for s in token_scores]
        lens = torch.tensor([sizes[j]], dtype=torch.int32, device=dev)
        segments.extend(_gather_chunks(k_c, v_c, lens, tok, cfg.token_budget, cfg, False))
        off += sizes[j]
    return _assemble(segments, dev), q_start


@torch.no_grad()
def build_prefilling_policy(
    model, input_ids, prompt, cfg: PrefillingConfig | None, timer, *, gen_length: int, progress: bool = False
):
    """Run prefill + scoring + selection and return the decode policy.

    Args:
        model: the dLLM.
        input_ids: used only when ``prompt`` is None (fallback split, see :func:`_parts_from_ids`).
        prompt: :class:`PromptParts` (prefix, context, query token ids).
        cfg: :class:`PrefillingConfig` (None = the checkpoint's ``prefilling_config.json``, else the
            paper's defaults: :meth:`PrefillingConfig.from_pretrained`).
        timer: the generation's PhaseTimer (phases ``prefill`` and ``scoring``).
        gen_length: response length (joint mode encodes the initial masks with the prompt).

    Returns:
        (policy, batch size 1, stats extra dict: selected_chunks, chunk_scores, num_chunks,
        s_I / s_P / s_C of the kept chunks (each only when it was computed), pseudo_labels,
        cached_tokens, anchor_token_id and its anchor_source, see :func:`resolve_anchor_token_id`).

    Raises:
        ValueError / TypeError: bad prompt parts (empty context or query, mask id, device),
            ``top_k`` larger than the number of chunks (raised before the chunked prefill).
    """
    cfg = cfg or PrefillingConfig.from_pretrained(getattr(model, "model_dir", None))
    if not isinstance(cfg, PrefillingConfig):
        raise TypeError(f"prefilling= must be a PrefillingConfig, got {type(cfg).__name__}")
    bos, anchor_source = resolve_anchor_token_id(model.config, model.tokenizer, cfg)
    if prompt is None:
        if input_ids is None:
            raise ValueError("method='prefilling' needs prompt=PromptParts(...) or input_ids")
        prompt = _parts_from_ids(model, input_ids, cfg, bos)
    parts = _check_parts(model, prompt)
    c = model.config
    pad = c.pad_token_id if c.pad_token_id is not None else bos
    n_chunks = len(cut_chunks(parts.context.numel(), cfg.chunk_size))
    k = n_chunks if cfg.top_k is None else cfg.top_k
    if k > n_chunks:  # checked before any model work
        raise ValueError(
            f"top_k={k} exceeds the {n_chunks} chunk(s) of this context ({parts.context.numel()} tokens / "
            f"chunk_size {cfg.chunk_size}); lower top_k or chunk_size, or pass top_k=None "
            "(CLI: --top-k all) to keep every chunk"
        )
    nfe = 0
    with timer.phase("prefill"):
        chunks, n = encode_chunks(
            model, parts.context, cfg.chunk_size, bos_id=bos, pad_id=pad, batch=cfg.prefill_batch, progress=progress
        )
        nfe += n
        prefix_kv = None
        if parts.prefix.numel() and cfg.cache_mode == "independent":
            prefix_kv = encode_segment(model, parts.prefix, torch.arange(parts.prefix.numel(), device=model.device))
            nfe += 1
    need_select = k < n_chunks
    need_tokens = cfg.token_budget is not None and cfg.cache_mode == "independent"
    extra = {"num_chunks": n_chunks, "anchor_token_id": bos, "anchor_source": anchor_source}
    with timer.phase("scoring"):
        scores = None
        if need_select or need_tokens:
            qw = parts.query if cfg.query_window is None else parts.query[-cfg.query_window :]
            labels, confirmed = draft_pseudo_labels(
                model, parts.prefix, parts.query, cfg.draft_tokens, cfg.draft_threshold
            )
            nfe += 1
            scores, n = score_chunks(
                model,
                chunks,
                qw,
                labels,
                confirmed,
                mode=cfg.score_mode,
                terms=cfg.score_terms,
                token_scores=need_tokens,
                batch=cfg.prefill_batch,
            )
            nfe += n
            extra["pseudo_labels"] = labels[confirmed].tolist()
        if need_select:
            kept = sorted(torch.topk(scores.total, k).indices.tolist())
        else:
            kept = list(range(n_chunks))
        if cfg.cache_mode == "independent":
            cache, q_start = _independent_cache(model, parts, chunks, kept, prefix_kv, scores, cfg)
        else:
            cache, q_start = _joint_cache(model, parts, chunks, kept, cfg, gen_length)
            nfe += 1
    extra["selected_chunks"] = kept
    if scores is not None:
        extra["chunk_scores"] = [round(float(scores.total[j]), 4) for j in kept]
        for name, term in (("s_I", scores.self_info), ("s_P", scores.pseudo_label), ("s_C", scores.answer_confidence)):
            if term is not None:  # a term that was never computed is left out, not reported as 0
                extra[name] = [round(float(term[j]), 4) for j in kept]
        extra["all_chunk_scores"] = [round(float(s), 4) for s in scores.total.tolist()]
    extra["cached_tokens"] = int(cache.tokens_per_row()[0])
    return PrefillingPolicy(model, parts.query, q_start, cache, timer, nfe), 1, extra
