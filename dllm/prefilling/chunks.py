"""Chunked prefill: cut the context into chunks, prepend a BOS anchor to each, encode them independently.

Each chunk ``BOS + c_j tokens`` is encoded alone, bidirectionally, at local
positions ``0..c_j`` (all chunks as one padded batch ``[N, C+1]``), so the cost is
``O(N * C^2)``: linear in the context length. Under RoPE the cached values and the
keys (up to one rotation) do not depend on where the chunk will sit later, so the
same cache serves every position mode and every question on the same document
(Prefilling-dLLM, arXiv 2606.10537, section "chunked prefill").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm.auto import tqdm


@dataclass
class ChunkCache:
    """K/V of independently encoded chunks.

    Attributes:
        k, v: per layer ``[N, C+1, Hkv, D]`` (model dtype); keys rotated at local positions
            (the BOS anchor at 0); rows beyond ``lens`` are padding.
        lens: ``[N]`` int32, cached tokens per chunk (BOS + context tokens).
        starts: offset of each chunk's first context token in the context.
        ids: ``[N, C+1]`` int64 the encoded tokens (BOS, chunk, padding).
    """

    k: list
    v: list
    lens: torch.Tensor
    starts: list
    ids: torch.Tensor

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
) -> tuple[ChunkCache, int]:
    """Chunked prefill of ``context [L_ctx]``.

    Args:
        model: the dLLM.
        context: ``[L_ctx]`` int64 token ids on the model's device.
        chunk_size: C.
        bos_id: anchor token put before every chunk.
        pad_id: filler of the last, shorter chunk (masked out of attention).
        batch: chunks per forward (None = all).
        progress: tqdm bar over chunk batches.

    Returns:
        (:class:`ChunkCache`, number of model forwards).

    Raises:
        ValueError: empty context, chunk_size < 1.
    """
    spans = cut_chunks(context.numel(), chunk_size)
    n, t = len(spans), min(chunk_size, context.numel()) + 1
    dev = context.device
    ids = torch.full((n, t), pad_id, dtype=torch.long, device=dev)
    ids[:, 0] = bos_id
    for i, (s, c) in enumerate(spans):
        ids[i, 1 : 1 + c] = context[s : s + c]
    lens = torch.tensor([c + 1 for _, c in spans], dtype=torch.int32, device=dev)
    valid = torch.arange(t, device=dev)[None, :] < lens[:, None]  # [N, T]
    pos = torch.arange(t, device=dev)
    step = batch or n
    ks, vs, nfe = None, None, 0
    for lo in tqdm(range(0, n, step), desc="chunked prefill", unit="batch", disable=not progress, leave=False):
        hi = min(n, lo + step)
        mask = None if bool(valid[lo:hi].all()) else valid[lo:hi]
        out = model(ids[lo:hi], pos, attention_mask=mask, logits_start=t, return_kv=True)
        nfe += 1
        if ks is None:
            ks, vs = [[k] for k in out.k], [[v] for v in out.v]
        else:
            for layer, (k, v) in enumerate(zip(out.k, out.v)):
                ks[layer].append(k)
                vs[layer].append(v)
    k = [torch.cat(parts) for parts in ks]
    v = [torch.cat(parts) for parts in vs]
    return ChunkCache(k, v, lens, [s for s, _ in spans], ids), nfe
