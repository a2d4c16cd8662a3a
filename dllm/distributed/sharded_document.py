"""``ShardedDocument``: one document's chunked prefill held by the ranks of a process group, each a
contiguous share of its chunks, and the collectives that move chunks between ranks (to the decoding rank,
or the whole document to one rank). Its files are :mod:`dllm.distributed.index_file`."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from dllm.distributed.group import all_gather, run_on_all, world
from dllm.distributed.index_file import load_sharded, save_sharded, shard_path
from dllm.distributed.shares import fit_width
from dllm.prefilling.chunks import ChunkCache, cut_chunks
from dllm.prefilling.document import DocumentCache


def kept_kv_bytes(model_config, chunk_size: int, kept: int, elt: int) -> int:
    """Bytes of K/V sent to the decoding rank for ``kept`` chunks: ``2 * layers * kept * (C + 1) * Hkv * D * elt``
    (``elt`` bytes per element: 2 for bf16). Token ids (``8 (C + 1)`` per chunk) not included."""
    c = model_config
    return 2 * c.num_layers * kept * (chunk_size + 1) * c.num_kv_heads * c.head_dim * elt


@dataclass
class ShardedDocument:
    """A document's chunked prefill spread over the ranks of a process group, each holding a contiguous share.

    Attributes:
        local: this rank's chunks as an ordinary :class:`~dllm.DocumentCache` of its token span (chunk
            ``j`` of the document is ``local`` chunk ``j - first_chunk``; ``local.chunks.starts`` count from
            the span's first token; K/V ``[n_r, T_r, Hkv, D]`` per layer in the model's dtype, on its device,
            ``T_r = min(C, span tokens) + 1``).
        bounds: ``[(lo_r, hi_r)]``, every rank's chunk range (:func:`shard_bounds`).
        num_tokens: context tokens of the whole document.
        pad_token_id: the padding id of a short chunk (for gathered ``ids``).
        group: the process group (None = the default group, or no group: one process).
        spans: ``(start, size)`` of every chunk of the whole document (fixed chunks of C when None is given;
            snapped ones, ``local.boundary_snap > 0``, must be given).
    """

    local: DocumentCache
    bounds: list
    num_tokens: int
    pad_token_id: int
    group: object = None
    spans: list | None = None
    _all_ids: list | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        if self.spans is None:
            if self.local.boundary_snap:
                raise ValueError("a ShardedDocument of snapped chunks needs its spans")
            self.spans = cut_chunks(self.num_tokens, self.local.chunk_size)
        self.spans = [tuple(s) for s in self.spans]

    @property
    def rank(self) -> int:
        return world(self.group)[0]

    @property
    def world_size(self) -> int:
        return len(self.bounds)

    @property
    def first_chunk(self) -> int:
        """Index in the document of this rank's first chunk."""
        return self.bounds[self.rank][0]

    @property
    def num_chunks(self) -> int:
        """N, chunks of the whole document."""
        return self.bounds[-1][1]

    @property
    def chunk_size(self) -> int:
        """C, the most tokens of a chunk (every rank's share uses the same)."""
        return self.local.chunk_size

    @property
    def boundary_snap(self) -> int:
        """The tolerance the chunk boundaries were snapped to sentence ends with (0 = fixed chunks)."""
        return self.local.boundary_snap

    @property
    def anchor_token_id(self) -> int:
        """Id of the BOS anchor at the head of every chunk."""
        return self.local.anchor_token_id

    @property
    def width(self) -> int:
        """T = min(C, L) + 1: the padded chunk length of the whole document's cache."""
        return min(self.chunk_size, self.num_tokens) + 1

    def __len__(self) -> int:
        return self.num_tokens

    def chunk_sizes(self) -> list[int]:
        """Context tokens of every chunk of the document (all N)."""
        return [size for _, size in self.spans]

    def owner(self, j: int) -> int:
        """The rank that holds chunk ``j``."""
        for r, (lo, hi) in enumerate(self.bounds):
            if lo <= j < hi:
                return r
        raise IndexError(f"chunk {j} is not in a document of {self.num_chunks} chunks")

    def context_ids(self) -> list:
        """Collective, cached: the ``[c_j]`` int64 CPU context tokens of every chunk of the document (anchor and
        padding dropped), on every rank (what redundancy-aware selection compares; token ids only, no K/V)."""
        if self._all_ids is None:
            c = self.local.chunks
            # clone: a chunk's ids are a view of the [N, T] ids tensor, and a pickled view carries its whole
            # storage (every chunk sent the rank's whole ids: 1 GB for a 1M-token question on 2 ranks)
            mine = [c.context_ids(j).cpu().clone() for j in range(c.num_chunks)]
            self._all_ids = [ids for part in all_gather(mine, self.group) for ids in part]
        return self._all_ids

    def collect(self, chunks: list, dst: int = 0) -> ChunkCache | None:
        """Chunks ``chunks`` (document indices, ascending) of the whole document, sent to rank ``dst``.

        Collective: every rank calls it with the same ``chunks``. Each owner sends one K/V tensor
        ``[2 * layers, n, T_r, Hkv, D]`` and one ids tensor ``[n, T_r]`` int64 to ``dst``
        (``send``/``recv``: gloo or NCCL); the root pads or cuts every chunk to :attr:`width`.

        Returns:
            On ``dst``: a :class:`~dllm.prefilling.chunks.ChunkCache` of those chunks in that order
            (K/V ``[n, T, Hkv, D]`` per layer, ``lens [n]`` int32, ``starts``: offsets in the document),
            bit-equal (valid rows) to the same rows of a single-process encoding. None elsewhere.

        Raises:
            ValueError: indices not ascending or outside ``0..N-1``; ``dst`` not a rank.
        """
        if sorted(set(chunks)) != list(chunks) or (chunks and not 0 <= chunks[0] <= chunks[-1] < self.num_chunks):
            raise ValueError(f"chunks must be distinct ascending indices in [0, {self.num_chunks}), got {chunks}")
        if not 0 <= dst < self.world_size:
            raise ValueError(f"dst={dst} is not a rank of a {self.world_size}-rank group")
        rank, c = self.rank, self.local.chunks
        mine = [j - self.first_chunk for j in chunks if self.bounds[rank][0] <= j < self.bounds[rank][1]]
        n_layers = len(c.k)
        dev = self.local.device

        def pack(rows):
            idx = torch.tensor(rows, dtype=torch.long, device=dev)
            kv = torch.stack([t.index_select(0, idx) for t in (*c.k, *c.v)])  # [2 L, n, T_r, Hkv, D]
            return kv, c.ids.index_select(0, idx).contiguous()

        if rank != dst:
            if mine:
                kv, ids = pack(mine)
                dist.send(kv.contiguous(), group_dst=dst, group=self.group)
                dist.send(ids, group_dst=dst, group=self.group)
            return None
        sizes, t = self.chunk_sizes(), self.width
        k_parts, v_parts, id_parts = [], [], []
        hkv_d = c.k[0].shape[2:]
        for r, (lo, hi) in enumerate(self.bounds):
            rows = [j - lo for j in chunks if lo <= j < hi]
            if not rows:
                continue
            if r == dst:
                kv, ids = pack(rows)
            else:
                t_r = min(self.chunk_size, sum(sizes[lo:hi])) + 1  # the owner's own width
                kv = torch.empty((2 * n_layers, len(rows), t_r, *hkv_d), dtype=c.k[0].dtype, device=dev)
                ids = torch.empty((len(rows), t_r), dtype=torch.long, device=dev)
                dist.recv(kv, group_src=r, group=self.group)
                dist.recv(ids, group_src=r, group=self.group)
            kv = fit_width(kv.flatten(0, 1), t, 0).view(2 * n_layers, len(rows), t, *hkv_d)
            k_parts.append(kv[:n_layers])
            v_parts.append(kv[n_layers:])
            id_parts.append(fit_width(ids, t, self.pad_token_id))
        k = torch.cat(k_parts, dim=1) if k_parts else c.k[0].new_empty((n_layers, 0, t, *hkv_d))
        v = torch.cat(v_parts, dim=1) if v_parts else c.v[0].new_empty((n_layers, 0, t, *hkv_d))
        ids = torch.cat(id_parts) if id_parts else c.ids.new_empty((0, t))
        lens = torch.tensor([sizes[j] + 1 for j in chunks], dtype=torch.int32, device=dev)
        return ChunkCache([k[i] for i in range(n_layers)], [v[i] for i in range(n_layers)], lens,
                          [self.spans[j][0] for j in chunks], ids)  # fmt: skip

    def whole_document(self, chunks: ChunkCache) -> DocumentCache:
        """A :class:`~dllm.DocumentCache` of ``chunks`` (:meth:`collect`'s result) with this document's chunk
        size, anchor, model fingerprint, version and ``boundary_snap``."""
        d = self.local
        return DocumentCache(chunks, d.chunk_size, d.anchor_token_id, dict(d.fingerprint), d.version, d.boundary_snap)

    def gather(self, dst: int = 0) -> DocumentCache | None:
        """The whole document's :class:`~dllm.DocumentCache` on rank ``dst`` (None on the others).

        Collective. The root then holds every chunk's K/V (the memory sharding saved; for a document
        that fits one device). Its valid rows equal ``dllm.encode_document`` of the whole document run in
        one process (bit for bit on the CPU); padding rows of a short last chunk may differ (never read).
        """
        chunks = run_on_all(lambda: self.collect(list(range(self.num_chunks)), dst), self.group)
        return None if chunks is None else self.whole_document(chunks)

    def shard_path(self, path, rank: int | None = None) -> str:
        """File of rank ``rank``'s shard (default this rank) beside the index ``path``:
        ``<path>.<rank:05d>-of-<world:05d>.safetensors``."""
        return shard_path(path, self.rank if rank is None else rank, self.world_size)

    def save(self, path) -> None:
        """Write every rank's shard and the index ``path`` (:func:`dllm.distributed.index_file.save_sharded`)."""
        save_sharded(self, path)

    @classmethod
    def load(cls, path, model, *, group=None, verify: bool = True) -> ShardedDocument:
        """Open a sharded document on this group, whatever its world size
        (:func:`dllm.distributed.index_file.load_sharded`)."""
        return load_sharded(cls, path, model, group=group, verify=verify)
