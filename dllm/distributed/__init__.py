"""Chunk-parallel Prefilling-dLLM over ``torch.distributed``: one document's chunks encoded and scored
on several processes (gloo on CPUs, NCCL on GPUs with one device per rank).

Chunks are encoded independently (Prefilling-dLLM, arXiv 2606.10537: every chunk is ``BOS + its
tokens`` at local positions), so the chunked prefill splits across ranks with no exchange at all,
unlike context parallelism in autoregressive engines (ring attention exchanges K/V at every layer).
Selection needs one score per chunk and the K/V of the K kept chunks only. The data flow, our
extension of the paper's method::

    rank r:  encode chunks [lo_r, hi_r)           (dllm.encode_document of its token span)
    root:    draft pseudo-labels (prefix + query, no context) -> broadcast query window + draft
    rank r:  score its chunks (dllm.prefilling.score_chunks)  -> all_gather the scores
    all:     top-K of the gathered scores (the same tensor everywhere: the same choice)
    owners:  send the kept chunks' K/V (and token ids) to the root, which decodes

The scoring tokens' own per-layer K/V are not broadcast: in a scoring pass they attend to the chunk
bidirectionally, so from the second layer on they depend on the chunk and each rank computes them in
its own scoring forward, exactly as one process does. What crosses ranks is the query window and
the draft (a few integers), ``3 N`` fp32 scores and the K kept chunks' K/V:
``2 * layers * (C + 1) * Hkv * D * elt`` bytes each (:func:`kept_kv_bytes`).

Equality with one process: a chunk's K/V and its scores depend on that chunk alone, and the chunks of
one forward do not interact (a chunk is one batch row), so on the CPU the sharded cache, the scores
and the generated tokens equal a single-process run bit for bit (tests/test_distributed.py; one exception:
a rank holding a single chunk scores it in a one-row forward, whose scores agree to ~1e-7, not bits); on GPUs
a different batch composition may change them at round-off level (cuBLAS picks kernels by shape).

API (every rank calls each function, collectively; ``group`` None = the default group, and without
an initialised process group everything runs in this one process)::

    doc = dllm.distributed.encode_document(model, ids, prefilling=cfg)     # ShardedDocument
    doc.save("doc.idx")                          # doc.idx + doc.idx.00000-of-00002.safetensors, ...
    doc = dllm.distributed.ShardedDocument.load("doc.idx", model)           # any world size <= N
    res = dllm.distributed.generate(model, doc, PromptParts(prefix, None, query), prefilling=cfg)
    # res: the GenerationResult on the root rank, None elsewhere
    full = doc.gather()                          # the whole DocumentCache on the root, None elsewhere

Errors: every collective step runs under :func:`run_on_all`: an exception on any rank is exchanged
and every rank raises the same :class:`RankError` naming the first failing rank, so no rank waits
forever for a peer that failed. A rank that dies (killed) makes its peers' next collective fail with
the backend's error (gloo: at once, a closed connection; NCCL: after the process group's timeout).

Launch from the command line: ``torchrun --nproc-per-node N -m dllm encode ...`` and
``torchrun ... -m dllm generate --document doc.idx ...`` (:mod:`dllm.cli.distributed`).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import traceback
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dllm.prefilling.chunks import ChunkCache, cut_chunks, pad_token_id
from dllm.prefilling.config import PrefillingConfig, resolve_anchor_token_id
from dllm.prefilling.document import MODEL_FIELDS, DocumentCache, model_fingerprint
from dllm.prefilling.document import encode_document as _encode_document
from dllm.prefilling.pipeline import Selection, check_parts, check_top_k
from dllm.prefilling.prompt import PromptParts
from dllm.prefilling.scoring import ChunkScores, draft_pseudo_labels, score_chunks

__all__ = [
    "RankError",
    "ShardedDocument",
    "encode_document",
    "generate",
    "init_from_env",
    "kept_kv_bytes",
    "read_index",
    "run_on_all",
    "score_and_select",
    "shard_bounds",
]

INDEX_FORMAT = 1
INDEX_KIND = "dllm_sharded_document"
INDEX_FIELDS = (
    "kind",
    "format",
    *MODEL_FIELDS,
    "chunk_size",
    "anchor_token_id",
    "pad_token_id",
    "num_chunks",
    "num_tokens",
    "version",
    "world_size",
    "shards",
)
DEFAULT_TIMEOUT_S = 1800.0  # collectives' timeout of init_from_env (PREFILLING_DLLM_DIST_TIMEOUT overrides)
_USER_ERRORS = (ValueError, TypeError, OSError, KeyError)  # a rank's bad input, not a bug
_TERMS = ("self_info", "pseudo_label", "answer_confidence")


class RankError(RuntimeError):
    """An exception raised on one rank, raised on every rank of the group by :func:`run_on_all`.

    Attributes:
        rank: the first rank that failed (-1: the collective itself failed, a peer left the group).
        kind: the original exception's class name.
        message: its message.
        user_error: the original was a ``ValueError``, ``TypeError``, ``OSError`` or ``KeyError`` (bad
            input: the CLI reports it as one ``error:`` line with status 2) rather than a bug.
        trace: the failing rank's formatted traceback.
        failed: ``[(rank, kind, message), ...]`` of every rank that failed.
    """

    def __init__(self, rank: int, kind: str, message: str, user_error: bool, trace: str = "", failed=()):
        where = f"rank {rank}" if rank >= 0 else "a rank"
        super().__init__(f"{where}: {message}")
        self.rank, self.kind, self.message, self.user_error, self.trace = rank, kind, message, user_error, trace
        self.failed = list(failed)


def _world(group=None) -> tuple[int, int]:
    """(rank, world size) in ``group``; (0, 1) without an initialised process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def run_on_all(fn, group=None):
    """Run ``fn()`` on this rank, then agree with every rank of ``group`` on whether all succeeded.

    Returns:
        ``fn()``'s value when it succeeded on every rank.

    Raises:
        RankError: on every rank alike when ``fn`` raised on any rank (the first failing rank, its
            exception's class, message and traceback); also when the agreement collective itself fails
            (a peer died: ``rank`` -1). Without a process group ``fn``'s own exception propagates.
    """
    if not _distributed():
        return fn()
    result, mine = None, None
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - any exception must reach the peers, or they would wait forever
        mine = (type(exc).__name__, " ".join(str(exc).split()) or type(exc).__name__,
                isinstance(exc, _USER_ERRORS), traceback.format_exc())  # fmt: skip
    _rank, world = _world(group)
    reports = [None] * world
    try:
        dist.all_gather_object(reports, mine, group=group)
    except Exception as exc:  # noqa: BLE001 - the backend's error type varies (gloo: RuntimeError, DistBackendError)
        first = " ".join(str(exc).split())[:300]
        raise RankError(-1, type(exc).__name__, f"the process group failed (a rank left?): {first}", False) from exc
    failed = [(r, rep) for r, rep in enumerate(reports) if rep is not None]
    if failed:
        r, (kind, msg, user, trace) = failed[0]
        raise RankError(r, kind, msg, user, trace, [(q, rep[0], rep[1]) for q, rep in failed])
    return result


def init_from_env(device: str | None = None, *, timeout_s: float | None = None) -> str:
    """Initialise the default process group from torchrun's environment and return this rank's device.

    ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` are read from the
    environment (``init_method="env://"``, as torchrun sets them). A CUDA device (``device`` "cuda",
    or None with CUDA available) gives NCCL with one GPU per rank (``cuda:LOCAL_RANK``, made the
    current device); anything else gloo on the CPU.

    Args:
        device: ``cuda``, ``cpu`` or None (CUDA when available).
        timeout_s: the collectives' timeout in seconds (default ``PREFILLING_DLLM_DIST_TIMEOUT`` or
            :data:`DEFAULT_TIMEOUT_S`): a rank waits this long for a peer that neither answers nor fails.

    Returns:
        The device string of this rank (``cuda:LOCAL_RANK`` or ``cpu``).

    Raises:
        ValueError: ``WORLD_SIZE``/``RANK`` missing or not integers, ``device`` cuda without CUDA, or
            fewer GPUs than local ranks.
    """
    try:
        world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
        local = int(os.environ.get("LOCAL_RANK", rank))
    except (KeyError, ValueError) as exc:
        raise ValueError(
            f"WORLD_SIZE, RANK (and LOCAL_RANK) must be set to integers, as torchrun does ({exc})"
        ) from None
    if timeout_s is None:
        timeout_s = float(os.environ.get("PREFILLING_DLLM_DIST_TIMEOUT", DEFAULT_TIMEOUT_S))
    want_cuda = (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    if want_cuda:
        if not torch.cuda.is_available():
            raise ValueError("device cuda was asked for but CUDA is not available")
        if local >= torch.cuda.device_count():
            raise ValueError(f"local rank {local} has no GPU: {torch.cuda.device_count()} visible; one GPU per rank")
        torch.cuda.set_device(local)
        dev, backend = f"cuda:{local}", "nccl"
    else:
        dev, backend = "cpu", "gloo"
    if not dist.is_initialized():
        dist.init_process_group(
            backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s),
            **({"device_id": torch.device(dev)} if backend == "nccl" else {}),
        )  # fmt: skip
    return dev


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


def kept_kv_bytes(model_config, chunk_size: int, kept: int, elt: int) -> int:
    """Bytes of K/V sent to the decoding rank for ``kept`` chunks: ``2 * layers * kept * (C + 1) * Hkv * D * elt``
    (``elt`` bytes per element: 2 for bf16). Token ids (``8 (C + 1)`` per chunk) not included."""
    c = model_config
    return 2 * c.num_layers * kept * (chunk_size + 1) * c.num_kv_heads * c.head_dim * elt


def _ids_digest(ids: torch.Tensor) -> str:
    return hashlib.sha256(ids.detach().long().cpu().contiguous().numpy().tobytes()).hexdigest()


def _fit_width(t: torch.Tensor, width: int, fill) -> torch.Tensor:
    """``t [n, T, ...]`` cut or padded (with ``fill``) along dim 1 to ``width`` (padding rows are never read)."""
    if t.shape[1] == width:
        return t
    if t.shape[1] > width:
        return t[:, :width]
    pad = t.new_full((t.shape[0], width - t.shape[1], *t.shape[2:]), fill)
    return torch.cat([t, pad], dim=1)


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
    """

    local: DocumentCache
    bounds: list
    num_tokens: int
    pad_token_id: int
    group: object = None

    @property
    def rank(self) -> int:
        return _world(self.group)[0]

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
        """C, tokens per chunk (every rank's share uses the same)."""
        return self.local.chunk_size

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
        return [size for _, size in cut_chunks(self.num_tokens, self.chunk_size)]

    def owner(self, j: int) -> int:
        """The rank that holds chunk ``j``."""
        for r, (lo, hi) in enumerate(self.bounds):
            if lo <= j < hi:
                return r
        raise IndexError(f"chunk {j} is not in a document of {self.num_chunks} chunks")

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
        sizes, spans, t = self.chunk_sizes(), cut_chunks(self.num_tokens, self.chunk_size), self.width
        k_parts, v_parts, id_parts = [], [], []
        hkv_d = c.k[0].shape[2:]
        for r, (lo, hi) in enumerate(self.bounds):
            rows = [j - lo for j in chunks if lo <= j < hi]
            if not rows:
                continue
            if r == dst:
                kv, ids = pack(rows)
            else:
                span_tokens = sum(sizes[lo:hi])
                t_r = min(self.chunk_size, span_tokens) + 1
                kv = torch.empty((2 * n_layers, len(rows), t_r, *hkv_d), dtype=c.k[0].dtype, device=dev)
                ids = torch.empty((len(rows), t_r), dtype=torch.long, device=dev)
                dist.recv(kv, group_src=r, group=self.group)
                dist.recv(ids, group_src=r, group=self.group)
            kv = _fit_width(kv.flatten(0, 1), t, 0).view(2 * n_layers, len(rows), t, *hkv_d)
            k_parts.append(kv[:n_layers])
            v_parts.append(kv[n_layers:])
            id_parts.append(_fit_width(ids, t, self.pad_token_id))
        k = torch.cat(k_parts, dim=1) if k_parts else c.k[0].new_empty((n_layers, 0, t, *hkv_d))
        v = torch.cat(v_parts, dim=1) if v_parts else c.v[0].new_empty((n_layers, 0, t, *hkv_d))
        ids = torch.cat(id_parts) if id_parts else c.ids.new_empty((0, t))
        lens = torch.tensor([sizes[j] + 1 for j in chunks], dtype=torch.int32, device=dev)
        return ChunkCache([k[i] for i in range(n_layers)], [v[i] for i in range(n_layers)], lens,
                          [spans[j][0] for j in chunks], ids)  # fmt: skip

    def gather(self, dst: int = 0) -> DocumentCache | None:
        """The whole document's :class:`~dllm.DocumentCache` on rank ``dst`` (None on the others).

        Collective. The root then holds every chunk's K/V (the memory sharding saved; for a document
        that fits one device). Its valid rows equal ``dllm.encode_document`` of the whole document run in
        one process (bit for bit on the CPU); padding rows of a short last chunk may differ (never read).
        """
        chunks = run_on_all(lambda: self.collect(list(range(self.num_chunks)), dst), self.group)
        if chunks is None:
            return None
        d = self.local
        return DocumentCache(chunks, d.chunk_size, d.anchor_token_id, dict(d.fingerprint), d.version)

    # --- files -----------------------------------------------------------------------------------------

    def shard_path(self, path, rank: int | None = None) -> str:
        """File of rank ``rank``'s shard (default this rank) beside the index ``path``:
        ``<path>.<rank:05d>-of-<world:05d>.safetensors``."""
        rank = self.rank if rank is None else rank
        return f"{os.fspath(path)}.{rank:05d}-of-{self.world_size:05d}.safetensors"

    def save(self, path) -> None:
        """Write every rank's shard (:meth:`DocumentCache.save`, its own SHA-256 header) and the index ``path``.

        Collective. Each rank writes :meth:`shard_path`; rank 0 then writes the index, a JSON file of
        :data:`INDEX_FIELDS` (the model fingerprint, C, N, L and every shard's file name, chunk range and
        a SHA-256 over its tensors' hashes, so shards of other encodings are refused on load). Several
        nodes need a shared filesystem (every shard beside the index).

        Raises:
            RankError: a rank could not write its shard (its ``OSError``) or rank 0 the index (every rank raises).
        """
        path = os.fspath(path)
        shard = self.shard_path(path)

        def write():
            if os.path.isdir(path):
                raise IsADirectoryError(21, "is a directory: the index is a file name", path)
            self.local.save(shard)
            head = DocumentCache.read_header(shard)
            lo, hi = self.bounds[self.rank]
            return {
                "file": os.path.basename(shard),
                "first_chunk": lo,
                "num_chunks": hi - lo,
                "num_tokens": head["num_tokens"],
                "tensor_digest": _hashes_digest(head["tensor_sha256"]),
            }

        entry = run_on_all(write, self.group)
        _rank, world = _world(self.group)
        entries = [entry] * world
        if _distributed():
            dist.all_gather_object(entries, entry, group=self.group)

        def write_index():
            if self.rank != 0:
                return
            d = self.local
            index = {
                "kind": INDEX_KIND,
                "format": INDEX_FORMAT,
                **{k: d.fingerprint[k] for k in MODEL_FIELDS},
                "chunk_size": d.chunk_size,
                "anchor_token_id": d.anchor_token_id,
                "pad_token_id": self.pad_token_id,
                "num_chunks": self.num_chunks,
                "num_tokens": self.num_tokens,
                "version": d.version,
                "world_size": self.world_size,
                "shards": entries,
            }
            tmp = f"{path}.tmp{os.getpid()}"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(index, f, indent=1)
            os.replace(tmp, path)

        run_on_all(write_index, self.group)

    @classmethod
    def load(cls, path, model, *, group=None, verify: bool = True) -> ShardedDocument:
        """Open a sharded document written by :meth:`save` on this group, whatever its world size.

        Collective. Each rank takes its share of the current group (:func:`shard_bounds`) and reads the
        rows it needs from the saved shards that hold them (one shard when the world size is the one
        that saved; parts of several otherwise), with :meth:`DocumentCache.load`'s checks (model
        fingerprint, layout, ``verify``: every tensor's SHA-256). Without a process group one process
        loads every shard (``.local`` is then the whole document).

        Raises:
            RankError (in a group) or, in one process, the error itself: ``FileNotFoundError`` (index or
            a shard missing); ``ValueError``: not a sharded index, a field that differs from the model
            (named), a shard that is not the one the index recorded, fewer chunks than ranks.
        """
        rank, world = _world(group)

        def load_local():
            index = read_index(path)
            _check_model_fields(index, model, path)
            bounds = shard_bounds(index["num_chunks"], world)
            lo, hi = bounds[rank]
            folder = os.path.dirname(os.path.abspath(os.fspath(path)))
            parts = []
            for s in index["shards"]:
                s0, s1 = s["first_chunk"], s["first_chunk"] + s["num_chunks"]
                if s1 <= lo or s0 >= hi:
                    continue
                file = os.path.join(folder, s["file"])
                doc = DocumentCache.load(file, model, verify=verify)
                head = DocumentCache.read_header(file)
                if (
                    _hashes_digest(head["tensor_sha256"]) != s["tensor_digest"]
                    or doc.num_chunks != s["num_chunks"]
                    or len(doc) != s["num_tokens"]
                    or doc.chunk_size != index["chunk_size"]
                    or doc.anchor_token_id != index["anchor_token_id"]
                ):
                    raise ValueError(
                        f"{file} is not the shard {path} recorded (other tensors, chunk count, chunk size or anchor): "
                        "encode the document again"
                    )
                parts.append((doc, max(lo, s0) - s0, min(hi, s1) - s0))
            local = _concat_rows(parts, index, lo, hi)
            return cls(local, bounds, index["num_tokens"], index["pad_token_id"], group)

        return run_on_all(load_local, group)


def _at_width(c: ChunkCache, width: int, pad_id: int) -> ChunkCache:
    """``c`` with K/V and ids padded (or cut) to ``width`` token rows; ``c`` itself when it has that width."""
    if c.k[0].shape[1] == width:
        return c
    return ChunkCache([_fit_width(k, width, 0) for k in c.k], [_fit_width(v, width, 0) for v in c.v], c.lens,
                      list(c.starts), _fit_width(c.ids, width, pad_id))  # fmt: skip


def _hashes_digest(hashes: dict) -> str:
    return hashlib.sha256(json.dumps(hashes, sort_keys=True).encode()).hexdigest()


def _concat_rows(parts: list, index: dict, lo: int, hi: int) -> DocumentCache:
    """Rows ``[a, b)`` of each loaded shard ``(doc, a, b)``, in order: the :class:`DocumentCache` of chunks
    ``lo..hi-1``."""
    first = parts[0][0]
    if len(parts) == 1 and parts[0][1] == 0 and parts[0][2] == first.num_chunks:
        return first
    spans = cut_chunks(index["num_tokens"], index["chunk_size"])
    span_tokens = sum(size for _, size in spans[lo:hi])
    t = min(index["chunk_size"], span_tokens) + 1
    n_layers = len(first.chunks.k)
    cat = lambda ts, fill: torch.cat([_fit_width(x, t, fill) for x in ts])  # noqa: E731
    k = [cat([d.chunks.k[i][a:b] for d, a, b in parts], 0) for i in range(n_layers)]
    v = [cat([d.chunks.v[i][a:b] for d, a, b in parts], 0) for i in range(n_layers)]
    ids = cat([d.chunks.ids[a:b] for d, a, b in parts], index["pad_token_id"])
    lens = torch.cat([d.chunks.lens[a:b] for d, a, b in parts])
    base = spans[lo][0]
    starts = [s - base for s, _ in spans[lo:hi]]
    return DocumentCache(ChunkCache(k, v, lens, starts, ids), first.chunk_size, first.anchor_token_id,
                         dict(first.fingerprint), first.version)  # fmt: skip


def read_index(path) -> dict:
    """The JSON index of a sharded document (:data:`INDEX_FIELDS`), checked for consistency; no shard is read.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not JSON, not a sharded-document index (e.g. a single-file document cache), another
            format, missing or ill-typed fields, shards that do not cut ``0..N-1`` contiguously or whose
            token counts disagree with cutting ``num_tokens`` into chunks of ``chunk_size``.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(1 << 24)
        index = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError(
            f"{path} is not a sharded document index (not JSON); a single-file document cache is answered from "
            "without torchrun"
        ) from None
    if not isinstance(index, dict) or index.get("kind") != INDEX_KIND:
        raise ValueError(f"{path} is not a sharded document index (no kind={INDEX_KIND!r})")
    if index.get("format") != INDEX_FORMAT:
        raise ValueError(
            f"format mismatch: {path} has format {index.get('format')!r}, this version reads {INDEX_FORMAT}"
        )
    missing = [k for k in INDEX_FIELDS if k not in index]
    if missing:
        raise ValueError(f"{path} is damaged: it lacks {', '.join(missing)}")
    for name in ("chunk_size", "num_chunks", "num_tokens", "world_size", "anchor_token_id", "pad_token_id"):
        v = index[name]
        if not isinstance(v, int) or isinstance(v, bool) or v < (0 if name.endswith("token_id") else 1):
            raise ValueError(f"{path} is damaged: {name}={v!r} is not a valid integer")
    spans = cut_chunks(index["num_tokens"], index["chunk_size"])
    shards = index["shards"]
    if len(spans) != index["num_chunks"] or not isinstance(shards, list) or len(shards) != index["world_size"]:
        raise ValueError(f"{path} is damaged: its chunk or shard counts disagree")
    nxt = 0
    for s in shards:
        ok = isinstance(s, dict) and all(isinstance(s.get(k), int) for k in ("first_chunk", "num_chunks", "num_tokens"))
        ok = ok and isinstance(s.get("file"), str) and os.path.basename(s["file"]) == s["file"] and s["file"]
        ok = ok and isinstance(s.get("tensor_digest"), str)
        if not ok or s["first_chunk"] != nxt or s["num_chunks"] < 1:
            raise ValueError(f"{path} is damaged: its shards do not cut the chunks 0..N-1 in order")
        nxt += s["num_chunks"]
        if s["num_tokens"] != sum(size for _, size in spans[s["first_chunk"] : nxt]):
            raise ValueError(
                f"{path} is damaged: shard {s['file']} holds {s['num_tokens']} tokens, its chunks hold other"
            )
    if nxt != index["num_chunks"]:
        raise ValueError(f"{path} is damaged: its shards hold {nxt} chunks, the index says {index['num_chunks']}")
    return index


def _check_model_fields(index: dict, model, path) -> None:
    have = model_fingerprint(model)
    for name in MODEL_FIELDS:
        if index.get(name) != have[name]:
            why = " (the model weights differ from those that encoded it)" if name == "model_weights" else ""
            raise ValueError(
                f"{name} mismatch: {path} was encoded with {name}={index.get(name)!r}, "
                f"the model has {have[name]!r}{why}"
            )


# --- encoding -------------------------------------------------------------------------------------------


def _checkpoint_config(model, chunk_size: int | None) -> PrefillingConfig:
    """The checkpoint's prefilling defaults (``prefilling_config.json``) as the sharded path runs them: a
    ``boundary_snap`` there is dropped to 0 (fixed chunks; snapped boundaries are not sharded yet) with a
    ``UserWarning``, so that a checkpoint that snaps by default still encodes under ``torchrun``. Asked for
    explicitly (``prefilling=``), the option is an error instead (:func:`_check_single_stage`)."""
    cfg = PrefillingConfig.from_pretrained(getattr(model, "model_dir", None), chunk_size=chunk_size)
    if cfg.boundary_snap:
        warnings.warn(
            f"dllm.distributed: the checkpoint's boundary_snap={cfg.boundary_snap} is not sharded yet; "
            f"fixed chunks of {cfg.chunk_size} tokens",
            stacklevel=3,
        )
        cfg = dataclasses.replace(cfg, boundary_snap=0)
    return cfg


def _check_single_stage(cfg: PrefillingConfig) -> None:
    """The issue-23 options (snapped boundaries, redundancy-aware selection, a first stage) are not sharded
    yet: a ``ValueError`` rather than a run that silently ignores them."""
    on = [
        f"{name}={getattr(cfg, name)!r}"
        for name, off in (("boundary_snap", 0), ("redundancy_threshold", None), ("candidates", None))
        if getattr(cfg, name) != off
    ]
    if on:
        raise ValueError(f"dllm.distributed does not support {', '.join(on)} yet: run it in one process")


@torch.no_grad()
def encode_document(
    model,
    context_ids: torch.Tensor,
    chunk_size: int | None = None,
    *,
    prefilling: PrefillingConfig | None = None,
    group=None,
    progress: bool = False,
) -> ShardedDocument:
    """Chunked prefill of a document shared by the ranks of ``group``: each encodes a contiguous share.

    Collective: every rank passes the same ``context_ids`` (checked: a SHA-256 of the ids is compared) and
    runs :func:`dllm.encode_document` on the tokens of its chunks ``[lo_r, hi_r)`` (:func:`shard_bounds`),
    so each chunk is encoded exactly as in one process (BOS anchor, local positions, ``prefill_batch``
    chunks per forward). Time: the slowest rank's share, ``ceil(N / W)`` chunks; no communication but
    the checks.

    Args:
        model: the dLLM, on this rank's device.
        context_ids: ``[L_ctx]`` int64/int32 token ids of the whole document on the model's device.
        chunk_size, prefilling, progress: as :func:`dllm.encode_document` (the bar on rank 0 only).
        group: the process group (None: the default one, or one process without a group).

    Returns:
        A :class:`ShardedDocument` (this rank's chunks in ``.local``).

    Raises:
        RankError: on every rank when any rank raised (``TypeError``/``ValueError`` of
            :func:`dllm.encode_document`, other ids on some rank, fewer chunks than ranks, or a
            ``prefilling`` with ``boundary_snap``, ``redundancy_threshold`` or ``candidates`` set: not
            sharded yet); in one process without a group the error itself. With ``prefilling=None`` a
            ``boundary_snap`` of the checkpoint's defaults is dropped to 0 with a ``UserWarning`` instead.
    """
    rank, world = _world(group)

    def check():
        cfg = prefilling or _checkpoint_config(model, chunk_size)
        if chunk_size is not None and chunk_size != cfg.chunk_size:
            raise ValueError(f"chunk_size={chunk_size} differs from prefilling.chunk_size={cfg.chunk_size}")
        _check_single_stage(cfg)
        if not torch.is_tensor(context_ids) or context_ids.dtype not in (torch.int64, torch.int32):
            raise TypeError("context_ids must be an int64/int32 tensor of token ids")
        if context_ids.dim() != 1 or context_ids.numel() == 0:
            raise ValueError(f"context_ids must be a non-empty 1-D tensor, got shape {tuple(context_ids.shape)}")
        return cfg, _ids_digest(context_ids)

    cfg, digest = run_on_all(check, group)
    if world > 1:
        digests = [None] * world
        dist.all_gather_object(digests, digest, group=group)
    else:
        digests = [digest]

    def encode_share():
        if digests[rank] != digests[0]:  # raised by the odd ranks, so the error names them
            raise ValueError(
                "this rank was given other context token ids than rank 0: every rank passes the whole document"
            )
        n_tokens = context_ids.numel()
        spans = cut_chunks(n_tokens, cfg.chunk_size)
        bounds = shard_bounds(len(spans), world)
        lo, hi = bounds[rank]
        a, b = spans[lo][0], spans[hi - 1][0] + spans[hi - 1][1]
        local = _encode_document(model, context_ids[a:b], prefilling=cfg, progress=progress and rank == 0)
        anchor = local.anchor_token_id
        return ShardedDocument(local, bounds, n_tokens, pad_token_id(model, anchor), group)

    return run_on_all(encode_share, group)


# --- scoring, selection, decoding -------------------------------------------------------------------------


def _broadcast(obj, src: int, group):
    if not _distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, group_src=src, group=group)
    return box[0]


@torch.no_grad()
def score_and_select(model, doc: ShardedDocument, prompt: PromptParts | None, cfg: PrefillingConfig, *, root: int = 0):
    """Score every chunk where it lives and choose the top-K identically on every rank.

    Collective. The root drafts pseudo-labels from ``prefix + query`` (no context,
    :func:`~dllm.prefilling.scoring.draft_pseudo_labels`) and broadcasts the query window and the draft;
    every rank scores its chunks (:func:`~dllm.prefilling.scoring.score_chunks` with ``cfg``'s mode, terms
    and batch); the scores are all-gathered in chunk order and the top-K taken on the gathered tensor.

    Args:
        model: the dLLM.
        doc: the sharded document.
        prompt: ``PromptParts(prefix, None, query)`` checked token ids; read on ``root`` only (None elsewhere).
        cfg: the prefilling configuration (``top_k``: K; None keeps every chunk unscored).
        root: the rank that drafts (and later decodes).

    Returns:
        ``(Selection, per-rank scoring forwards)``: the :class:`~dllm.prefilling.pipeline.Selection`
        (``kept`` ascending, ``scores``: :class:`~dllm.prefilling.scoring.ChunkScores` of all N chunks as
        ``[N]`` fp32 CPU tensors, None when nothing was scored, ``pseudo_labels``) is the same on every rank.
    """
    _check_single_stage(cfg)  # the same on every rank: raised before any collective
    rank, world = _world(doc.group)
    n = doc.num_chunks
    k = n if cfg.top_k is None else cfg.top_k
    if k >= n:
        return Selection(list(range(n)), None, None, 0), [0] * world

    def draft():
        if rank != root:
            return None
        labels, confirmed = draft_pseudo_labels(
            model, prompt.prefix, prompt.query, cfg.draft_tokens, cfg.draft_threshold
        )
        window = prompt.query if cfg.query_window is None else prompt.query[-cfg.query_window :]
        return window.tolist(), labels.tolist(), confirmed.tolist()

    payload = _broadcast(run_on_all(draft, doc.group), root, doc.group)
    window, labels, confirmed = (torch.tensor(x, device=model.device) for x in payload)

    def score():
        # at the document's padded width: a rank holding the short last chunk alone encoded it narrower, and the
        # scoring pass's arithmetic (not its result beyond round-off) depends on the padded key length
        chunks = _at_width(doc.local.chunks, doc.width, doc.pad_token_id)
        sc, nfe = score_chunks(
            model, chunks, window, labels, confirmed,
            mode=cfg.score_mode, terms=cfg.score_terms, token_scores=False, batch=cfg.prefill_batch,
        )  # fmt: skip
        terms = {t: (None if getattr(sc, t) is None else getattr(sc, t).float().cpu()) for t in _TERMS}
        return terms, nfe

    mine = run_on_all(score, doc.group)
    everyone = [mine] * world
    if world > 1:
        dist.all_gather_object(everyone, mine, group=doc.group)
    terms = {}
    for t in _TERMS:
        parts = [e[0][t] for e in everyone]
        terms[t] = None if parts[0] is None else torch.cat(parts)
    scores = ChunkScores(terms["self_info"], terms["pseudo_label"], terms["answer_confidence"], total=None)
    scores.total = sum(getattr(scores, t) for t in cfg.score_terms)
    kept = sorted(torch.topk(scores.total, k).indices.tolist())
    pseudo = [lab for lab, c in zip(labels.tolist(), confirmed.tolist()) if c]
    return Selection(kept, scores, pseudo, 1 + max(e[1] for e in everyone)), [e[1] for e in everyone]


@torch.no_grad()
def generate(
    model,
    document: ShardedDocument,
    prompt: PromptParts | None,
    *,
    prefilling: PrefillingConfig | None = None,
    root: int = 0,
    **kwargs,
):
    """Answer a question from a sharded document: distributed scoring and selection, decoding on ``root``.

    Collective. Runs :func:`score_and_select`, sends the K kept chunks' K/V to ``root``
    (:meth:`ShardedDocument.collect`) and there calls :func:`dllm.generate` with ``method="prefilling"``
    over a :class:`~dllm.DocumentCache` of exactly those chunks (so no chunk is scored again, and the
    static cache, positions and denoising steps are those of one process). The tokens equal a
    single-process ``dllm.generate(..., document=whole_document)`` with the same config (greedy
    decoding; bit for bit on the CPU).

    Args:
        model: the dLLM on this rank's device.
        document: the :class:`ShardedDocument`.
        prompt: ``PromptParts(prefix, None, query)`` (1-D token ids on the model's device); read on
            ``root`` only, may be None elsewhere.
        prefilling: :class:`~dllm.PrefillingConfig` (default: the checkpoint's, with the document's chunk
            size), the same on every rank. ``position_mode="absolute"`` is not supported here (the
            decoding rank holds the kept chunks only: a ``ValueError``); ``continuous`` and ``reuse`` are.
        root: the rank that decodes.
        **kwargs: :func:`dllm.generate`'s decoding options (``gen_length``, ``steps``, ``alg``, ``seed``...).

    Returns:
        On ``root``: the :class:`~dllm.GenerationResult`; ``stats.extra`` holds the whole document's
        ``num_chunks``, ``selected_chunks``, ``all_chunk_scores``, the kept chunks' scores, and
        ``distributed`` (``world_size``, ``kv_bytes_to_root``, ``scoring_nfe`` per rank). ``stats.nfe``
        counts the root's forwards (its draft and scoring passes included). None on other ranks.

    Raises:
        RankError: on every rank when any rank failed (bad prompt or config: the original ``ValueError``'s
            message, ``top_k`` larger than N, a document of another model...).
    """
    import dllm  # the package's generate (late: dllm imports this module lazily, never at import time)

    rank, world = _world(document.group)
    doc = document

    def setup():
        cfg = prefilling or _checkpoint_config(model, doc.chunk_size)
        if not isinstance(cfg, PrefillingConfig):
            raise TypeError(f"prefilling= must be a PrefillingConfig, got {type(cfg).__name__}")
        if cfg.position_mode == "absolute":
            raise ValueError(
                "position_mode='absolute' is not supported across ranks "
                "(the decoding rank holds only the kept chunks): "
                "use continuous or reuse, or gather the document (ShardedDocument.gather) and decode in one process"
            )
        bos, _src = resolve_anchor_token_id(model.config, model.tokenizer, cfg)
        doc.local.check_model(model)
        doc.local.check_config(cfg, bos)
        check_top_k(cfg, doc.num_chunks, doc.num_tokens)
        parts = None
        if rank == root:
            if prompt is not None and prompt.context is not None:
                raise ValueError("pass the prompt as PromptParts(prefix, None, query): the context is the document")
            parts = check_parts(model, prompt, doc.local)
        return cfg, parts

    cfg, parts = run_on_all(setup, doc.group)
    sel, scoring_nfe = score_and_select(model, doc, parts, cfg, root=root)
    kept = run_on_all(lambda: doc.collect(sel.kept, root), doc.group)

    def decode():
        if rank != root:
            return None
        d = doc.local
        kept_doc = DocumentCache(kept, d.chunk_size, d.anchor_token_id, dict(d.fingerprint), d.version)
        res = dllm.generate(
            model, method="prefilling", prompt=parts, document=kept_doc,
            prefilling=dataclasses.replace(cfg, top_k=None), **kwargs,
        )  # fmt: skip
        _restate_selection(res, sel, doc, kept, scoring_nfe, root)
        return res

    return run_on_all(decode, doc.group)


def _restate_selection(
    res, sel: Selection, doc: ShardedDocument, kept: ChunkCache, scoring_nfe: list, root: int
) -> None:
    """Stats of the whole document in ``res.stats`` (the root decoded over the kept chunks only)."""
    extra = res.stats.extra
    extra["num_chunks"] = doc.num_chunks
    sel.write_stats(extra)  # the sharded run's scores have no first stage (_check_single_stage)
    if sel.scores is not None:
        res.stats.nfe += 1 + scoring_nfe[root]  # the root's draft and scoring passes
    elt = kept.k[0].element_size()
    sent = sum(1 for j in sel.kept if doc.owner(j) != doc.rank)
    per_chunk = 2 * len(kept.k) * kept.k[0][0].numel() * elt + kept.ids[0].numel() * 8 if kept.num_chunks else 0
    extra["distributed"] = {
        "world_size": len(scoring_nfe),
        "kv_bytes_to_root": sent * per_chunk,
        "scoring_nfe": scoring_nfe,
    }
    if res.stats.rows:
        res.stats.rows[0].update({k: extra[k] for k in ("num_chunks", "selected_chunks") if k in extra})
