"""Static KV cache: per-layer key/value pools plus one segment table.

The static part of a prompt (a prefix, or the kept context chunks) is encoded
once and reused for every denoising step. Its keys and values live in a pool of
``P`` slots of ``T`` tokens per layer; each batch row lists the slots it attends
to (``seg_slots``, -1 = none) and how many tokens of each slot are valid
(``seg_lens``). This is exactly the input of ``triton_kernels.split_s_attention``,
so the pools are never gathered into contiguous memory.

Keys are stored with RoPE already applied at the positions the segment should
have for decoding. A :class:`Segment` is one such run of tokens before it is packed
into a pool; :meth:`StaticKVCache.from_rows` packs each batch row's segments (a segment shared by
several rows, e.g. their common prefix, into one slot that every such row names).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import InitVar, dataclass

import torch

import triton_kernels


@dataclass
class Segment:
    """One contiguous run of static tokens (a prefix, or one kept chunk) of one batch row.

    Attributes:
        k: list over layers of ``[T, Hkv, D]`` keys, RoPE applied at their decode positions.
        v: list over layers of ``[T, Hkv, D]`` values.
        length: valid tokens, ``0 <= length <= T`` (rows beyond are padding).
    """

    k: list
    v: list
    length: int

    def __post_init__(self):
        if len(self.k) != len(self.v) or not self.k:
            raise ValueError(f"a Segment needs one K and one V per layer, got {len(self.k)}/{len(self.v)}")
        if not 0 <= self.length <= self.k[0].shape[0]:
            raise ValueError(f"segment length {self.length} outside [0, {self.k[0].shape[0]}]")


@dataclass
class StaticKVCache:
    """Per-layer K/V pools and the segment table shared by all layers.

    Attributes:
        k: list over layers of ``[P, T, Hkv, D]`` keys (RoPE applied), model dtype.
        v: list over layers of ``[P, T, Hkv, D]`` values.
        seg_slots: ``[B, S]`` int32, pool slot of each segment per batch row, -1 = none.
        seg_lens: ``[B, S]`` int32, valid tokens 0..T of that slot.

        live_in_pool: the live tokens' own K/V are already in the pools (written there by the forward's
            ``attn_hook`` before attention, :class:`dllm.decode.block_cache.BlockCache`) and the table names
            them: a forward over this cache attends to the pools only (no ``k_live``), so no key is counted
            twice. False (default): the live K/V are passed to attention beside the pools.

    Args (init only):
        table_checked: the caller built the table from host values it knows are in range (as
            :meth:`single_segment` does), so the one-time value check and its host sync are skipped.

    Raises:
        ValueError: K and V pools of different layer counts, tables of different shapes or not
            ``[B, S]``, a slot outside ``[-1, P)`` or a length outside ``[0, T]``
            (:func:`triton_kernels.check_segment_table`, run once here: the table is not checked again
            when a forward attends to it).
        TypeError: tables that are not int32/int64.
    """

    k: list
    v: list
    seg_slots: torch.Tensor
    seg_lens: torch.Tensor
    table_checked: InitVar[bool] = False
    live_in_pool: bool = False

    def __post_init__(self, table_checked=False):
        if len(self.k) != len(self.v) or not self.k:
            raise ValueError(f"StaticKVCache needs one K and one V pool per layer, got {len(self.k)}/{len(self.v)}")
        if self.seg_slots.shape != self.seg_lens.shape or self.seg_slots.dim() != 2:
            raise ValueError(
                f"seg_slots {tuple(self.seg_slots.shape)} and seg_lens {tuple(self.seg_lens.shape)} must both be [B, S]"
            )
        # Checked once here (one host sync), so that every forward over this cache runs the kernels
        # inside triton_kernels.skip_value_checks(): a denoising step pays no per-call value check.
        if table_checked:  # e.g. prefix_cache's rebuild at every block start: no host read there
            return
        p, t = self.k[0].shape[:2]
        triton_kernels.check_segment_table(self.seg_slots, self.seg_lens, p, t)

    @property
    def num_layers(self) -> int:
        return len(self.k)

    @property
    def batch_size(self) -> int:
        return self.seg_slots.shape[0]

    def tokens_per_row(self) -> torch.Tensor:
        """Valid cached tokens each batch row attends to, ``[B]`` int64."""
        return torch.where(self.seg_slots >= 0, self.seg_lens, 0).long().sum(dim=1)

    def nbytes(self) -> int:
        """Bytes held by the pools (all layers, K and V)."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[Segment]]) -> StaticKVCache:
        """Pack each batch row's segments into one pool per layer, a segment shared by rows stored once.

        Every distinct :class:`Segment` object gets its own slot (slots numbered in order of first
        appearance, row by row); the same object named again, by another row or twice in one row,
        points to the slot it already has. This is how a prefix shared by the rows of a batch is
        stored once: the batched prefill (:func:`dllm.prefilling.pipeline.prefill_rows`) encodes equal
        prefixes (same token ids at the same positions, so identical K/V) once and hands that one
        segment to every row. Rows with fewer segments than the longest one get slot -1 (no segment)
        in the table. The pool's token axis is the longest segment, zero-padded.

        Sharing a slot changes no row's attention: a row reads the same keys and values, in the same
        table order, whichever slot number holds them (the kernels read segments through the
        ``[B, S]`` table, and two rows may name one slot). Segments that are equal in value but are
        different objects are not compared (that would read every key) and keep their own slots.

        Args:
            rows: B lists of :class:`Segment` (same layers, heads, head dim and dtype).

        Returns:
            A cache with pools ``[P, T, Hkv, D]`` (P = distinct segments, T = longest length, >= 1)
            and a ``[B, S]`` int32 segment table (S = most segments in a row).

        Raises:
            ValueError: no row, or no segment at all.
        """
        slot_of: dict[int, int] = {}  # id(segment) -> its slot
        segments = []  # distinct segments, in slot order
        for row in rows:
            for seg in row:
                if id(seg) not in slot_of:
                    slot_of[id(seg)] = len(segments)
                    segments.append(seg)
        if not rows or not segments:
            raise ValueError("from_rows needs at least one row holding at least one segment")
        t = max(max(seg.length for seg in segments), 1)
        ks, vs = [], []
        for layer in range(len(segments[0].k)):
            proto = segments[0].k[layer]
            shape = (len(segments), t) + tuple(proto.shape[-2:])
            kp, vp = proto.new_zeros(shape), proto.new_zeros(shape)
            for slot, seg in enumerate(segments):
                kp[slot, : seg.length] = seg.k[layer][: seg.length]
                vp[slot, : seg.length] = seg.v[layer][: seg.length]
            ks.append(kp)
            vs.append(vp)
        n_seg = max(len(row) for row in rows)
        slots = torch.full((len(rows), n_seg), -1, dtype=torch.int32)
        lens = torch.zeros((len(rows), n_seg), dtype=torch.int32)
        for b, row in enumerate(rows):
            for s, seg in enumerate(row):
                slots[b, s], lens[b, s] = slot_of[id(seg)], seg.length
        dev = ks[0].device
        return cls(ks, vs, slots.to(dev), lens.to(dev))

    @property
    def num_slots(self) -> int:
        """``P``, the pool's slot count (distinct segments stored)."""
        return self.k[0].shape[0]

    @classmethod
    def single_segment(cls, k_layers, v_layers, length: int | None = None) -> StaticKVCache:
        """One contiguous prefix per batch row: row b attends to slot b.

        Args:
            k_layers, v_layers: per layer ``[B, T, Hkv, D]`` (e.g. the K/V returned by a
                model forward with ``return_kv=True``).
            length: valid tokens per row (default T).
        """
        b, t = k_layers[0].shape[:2]
        n = t if length is None else int(length)
        if not 0 <= n <= t:
            raise ValueError(f"length {n} outside [0, {t}]")
        dev = k_layers[0].device
        slots = torch.arange(b, dtype=torch.int32, device=dev)[:, None]
        lens = torch.full((b, 1), n, dtype=torch.int32, device=dev)
        # slot b < B = P and 0 <= n <= T by construction (checked above on the host)
        return cls(list(k_layers), list(v_layers), slots, lens, table_checked=True)
