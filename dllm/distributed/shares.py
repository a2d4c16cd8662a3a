"""Which rank holds which chunks (contiguous, balanced shares), and chunk caches brought to one padded width."""

from __future__ import annotations

import torch

from dllm.prefilling.chunks import ChunkCache


def shard_bounds(num_chunks: int, world_size: int) -> list[tuple[int, int]]:
    """Contiguous, balanced shares of ``num_chunks`` chunks: ``[(lo_r, hi_r)]`` for ranks 0..W-1.

    Rank r holds chunks ``r N // W .. (r + 1) N // W - 1`` (sizes differ by at most one).

    Raises:
        ValueError: ``world_size < 1`` or fewer chunks than ranks (a rank would hold no chunk: use
            fewer processes or a smaller chunk size).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if num_chunks < world_size:
        raise ValueError(
            f"a document of {num_chunks} chunk(s) cannot be shared by {world_size} ranks (each needs one chunk at "
            "least): use fewer processes or a smaller chunk size"
        )
    return [(r * num_chunks // world_size, (r + 1) * num_chunks // world_size) for r in range(world_size)]


def fit_width(t: torch.Tensor, width: int, fill) -> torch.Tensor:
    """``t [n, T, ...]`` cut or padded (with ``fill``) along dim 1 to ``width`` (padding rows are never read)."""
    if t.shape[1] == width:
        return t
    if t.shape[1] > width:
        return t[:, :width]
    pad = t.new_full((t.shape[0], width - t.shape[1], *t.shape[2:]), fill)
    return torch.cat([t, pad], dim=1)


def at_width(c: ChunkCache, width: int, pad_id: int) -> ChunkCache:
    """``c`` with K/V and ids padded (or cut) to ``width`` token rows; ``c`` itself when it has that width."""
    if c.k[0].shape[1] == width:
        return c
    return ChunkCache([fit_width(k, width, 0) for k in c.k], [fit_width(v, width, 0) for v in c.v], c.lens,
                      list(c.starts), fit_width(c.ids, width, pad_id))  # fmt: skip
