"""Where kept chunks and the query sit at decode time.

Chunks are cached at local positions (BOS anchor at 0). After selection each kept
chunk is moved by rotating its keys by a position delta (RoPE is relative, so that
is exact). With ``P`` prefix tokens (at 0..P-1), kept chunks ``j_1 < ... < j_K`` of
``c_j`` context tokens and chunk size ``C``:

- ``reuse``: every chunk at ``P..P+c_j`` (BOS at P); the query after the longest.
- ``continuous``: chunk k right after chunk k-1 (BOS included), starting at P; the
  query right after the last kept chunk. The reference code's default.
- ``absolute``: every context token at its position in the original prompt
  ``P + s_j + i`` (``s_j`` = the chunk's offset, ``j*C`` for fixed chunks); the BOS anchor one position
  before its chunk's first token; the query at ``P + L_ctx``.

In ``joint`` cache mode the chunks are re-encoded without BOS anchors, so the same
rules apply with a chunk length of ``c_j`` instead of ``c_j + 1``.
"""

from __future__ import annotations


def chunk_offsets(
    mode: str,
    prefix_len: int,
    kept: list,
    sizes: list,
    chunk_size: int,
    *,
    anchors: bool = True,
    chunk_starts: list | None = None,
):
    """Start position of each kept chunk's first cached token, and where the query starts.

    Args:
        mode: ``reuse`` / ``continuous`` / ``absolute``.
        prefix_len: P.
        kept: kept chunk indices, ascending.
        sizes: context tokens of every chunk (all N).
        chunk_size: C.
        anchors: chunks carry a BOS anchor (independent mode) or not (joint mode).
        chunk_starts: offset of every chunk's first token in the context (all N; default ``j * C``, the
            fixed cut). ``absolute`` mode places chunks by it (chunks snapped to sentence ends differ).

    Returns:
        (starts: list of K ints, query_start: int).

    Raises:
        ValueError: unknown mode.
    """
    a = 1 if anchors else 0
    if mode == "reuse":
        return [prefix_len] * len(kept), prefix_len + max(sizes[j] for j in kept) + a
    if mode == "continuous":
        starts, p = [], prefix_len
        for j in kept:
            starts.append(p)
            p += sizes[j] + a
        return starts, p
    if mode == "absolute":
        if chunk_starts is None:
            return [prefix_len + j * chunk_size - a for j in kept], prefix_len + sum(sizes)
        return [prefix_len + chunk_starts[j] - a for j in kept], prefix_len + sum(sizes)
    raise ValueError(f"unknown position mode {mode!r}")
