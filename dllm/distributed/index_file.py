"""The files of a sharded document: one JSON index and one shard per rank that saved it.

``book.idx`` (the index: :data:`INDEX_FIELDS`, the model fingerprint, C, ``boundary_snap``, every chunk's
size and every shard's file name, chunk range and a SHA-256 over its tensors' hashes) and
``book.idx.<r:05d>-of-<W:05d>.safetensors`` beside it, each a :class:`~dllm.DocumentCache` file of rank r's
chunks whose header carries a ``shard`` field (so that one shard alone is refused as a document:
:meth:`~dllm.DocumentCache.load` without ``shard=True``).

Writing never follows a link the user did not type: every file is written to a new temporary file
(``tempfile.mkstemp``: an unpredictable name created with ``O_EXCL``) in the target's folder and renamed
over its name, so a symlink planted at a shard's name or at a temporary name is replaced, not written
through. The index itself, named by the user, is written where a symlink there points (as
:meth:`~dllm.DocumentCache.save` does), unless another user owns that link in a sticky world-writable
folder (:func:`dllm.file_targets.link_target`). An existing file keeps its permission bits; a new one gets
``0o666 & ~umask``.

Format 2 adds ``boundary_snap`` and ``chunk_sizes`` (snapped chunks); a format-1 index reads as fixed chunks.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import tempfile

import torch

from dllm.distributed.group import all_gather, run_on_all, world
from dllm.distributed.shares import fit_width, shard_bounds
from dllm.file_targets import current_umask, link_target
from dllm.model.json_files import read_json
from dllm.prefilling.chunks import ChunkCache, cut_chunks
from dllm.prefilling.document import MODEL_FIELDS, DocumentCache, model_fingerprint

INDEX_FORMAT = 2  # 2: boundary_snap and chunk_sizes (snapped chunks); shards carry a "shard" header field
READABLE_INDEX_FORMATS = (1, 2)
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
    "boundary_snap",
    "chunk_sizes",
)
FIELDS_SINCE = {"boundary_snap": 2, "chunk_sizes": 2}  # what a format-1 index lacks (fixed chunks)


def shard_path(path, rank: int, world_size: int) -> str:
    """File of rank ``rank``'s shard beside the index ``path``: ``<path>.<rank:05d>-of-<world:05d>.safetensors``."""
    return f"{os.fspath(path)}.{rank:05d}-of-{world_size:05d}.safetensors"


def _hashes_digest(hashes: dict) -> str:
    return hashlib.sha256(json.dumps(hashes, sort_keys=True).encode()).hexdigest()


def _write_replacing(path: str, write, mode: int | None = None) -> None:
    """Write ``path`` through ``write(tmp_name)`` on a fresh temporary file beside it, then rename it over
    ``path``: a symlink at ``path`` is replaced, never followed. The file keeps the permission bits of a
    regular file it replaces (``mode`` when given), else ``0o666 & ~umask``.

    Raises:
        IsADirectoryError: ``path`` is a directory. FileExistsError: ``path`` is a device, FIFO or socket
        (never replaced). OSError: the folder cannot be written.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory: give a file name", path)
    if st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise FileExistsError(errno.EEXIST, "exists and is not a regular file", path)
    if mode is None:
        mode = stat.S_IMODE(st.st_mode) if st is not None and stat.S_ISREG(st.st_mode) else 0o666 & ~current_umask()
    folder, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)  # O_EXCL, 0600, random name
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


class _ShardFile(DocumentCache):
    """A rank's chunks written as one shard: a document cache whose header says which shard it is."""

    shard: dict = None

    def header(self, *args, **kwargs) -> dict:
        return {**super().header(*args, **kwargs), "shard": self.shard}


def save_sharded(doc, path) -> None:
    """Write every rank's shard of ``doc`` (a :class:`~dllm.distributed.ShardedDocument`) and the index ``path``.

    Collective. Each rank writes its shard (:func:`shard_path`: a :class:`~dllm.DocumentCache` file with its
    own SHA-256 header, marked as a shard); rank 0 then writes the index, a JSON file of :data:`INDEX_FIELDS`
    (the model fingerprint, C, ``boundary_snap``, every chunk's size and every shard's file name, chunk range
    and a SHA-256 over its tensors' hashes, so shards of other encodings are refused on load). Several nodes
    need a shared filesystem (every shard beside the index). Files are written as the module docstring says
    (temporary file + rename; a symlink at a shard name is replaced, not followed).

    Raises:
        RankError: a rank could not write its shard (its ``OSError``) or rank 0 the index (every rank raises).
    """
    path = os.fspath(path)
    rank, size = doc.rank, doc.world_size
    shard = shard_path(path, rank, size)

    def write():
        if os.path.isdir(path):
            raise IsADirectoryError(errno.EISDIR, "is a directory: the index is a file name", path)
        d = doc.local
        lo, hi = doc.bounds[rank]
        marked = _ShardFile(d.chunks, d.chunk_size, d.anchor_token_id, d.fingerprint, d.version, d.boundary_snap)
        marked.shard = {"index": os.path.basename(path), "rank": rank, "world_size": size, "first_chunk": lo}
        _write_replacing(shard, marked.save)
        head = DocumentCache.read_header(shard, shard=True)
        return {
            "file": os.path.basename(shard),
            "first_chunk": lo,
            "num_chunks": hi - lo,
            "num_tokens": head["num_tokens"],
            "tensor_digest": _hashes_digest(head["tensor_sha256"]),
        }

    entries = all_gather(run_on_all(write, doc.group), doc.group)

    def write_index():
        if rank != 0:
            return
        d = doc.local
        index = {
            "kind": INDEX_KIND,
            "format": INDEX_FORMAT,
            **{k: d.fingerprint[k] for k in MODEL_FIELDS},
            "chunk_size": d.chunk_size,
            "anchor_token_id": d.anchor_token_id,
            "pad_token_id": doc.pad_token_id,
            "num_chunks": doc.num_chunks,
            "num_tokens": doc.num_tokens,
            "version": d.version,
            "world_size": size,
            "shards": entries,
            "boundary_snap": d.boundary_snap,
            "chunk_sizes": doc.chunk_sizes(),
        }
        text = json.dumps(index, indent=1)
        target = path
        if os.path.islink(path) and os.path.isfile(os.path.realpath(path)):
            target = link_target(path)  # the name the user typed: write the file it names, keep the link

        def dump(tmp):
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)

        _write_replacing(target, dump)

    run_on_all(write_index, doc.group)


def _int(v, low: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def read_index(path) -> dict:
    """The JSON index of a sharded document (:data:`INDEX_FIELDS`), checked for consistency; no shard is read.

    Read by the package's JSON reader (:func:`dllm.model.json_files.read_json`: a BOM is skipped; invalid
    JSON, nesting past the recursion limit or an integer too long to convert is one error naming the file).
    A format-1 index gets ``boundary_snap`` 0 and the fixed chunks' sizes.

    Raises:
        FileNotFoundError, IsADirectoryError, PermissionError: the file cannot be read (naming it).
        ValueError: not JSON, not a sharded-document index (e.g. a single-file document cache), another
            format (an integer of :data:`READABLE_INDEX_FORMATS`), missing or ill-typed fields, chunk sizes
            that do not cut ``num_tokens`` (fixed chunks: as :func:`~dllm.prefilling.cut_chunks`), shards that
            do not cut ``0..N-1`` contiguously or whose token counts disagree with their chunks'.
    """
    path = os.fspath(path)
    index = read_json(
        path,
        lambda msg: ValueError(
            f"{msg}: not a sharded document index (a single-file document cache is answered from without torchrun)"
        ),
    )
    if index.get("kind") != INDEX_KIND:
        raise ValueError(f"{path} is not a sharded document index (no kind={INDEX_KIND!r})")
    fmt = index.get("format")
    if not _int(fmt, 0) or fmt not in READABLE_INDEX_FORMATS:
        raise ValueError(
            f"format mismatch: {path} has format {fmt!r}, this version reads "
            f"{' and '.join(map(str, READABLE_INDEX_FORMATS))}; encode the document again with this version"
        )
    if fmt < 2:
        index.setdefault("boundary_snap", 0)
        if _int(index.get("num_tokens"), 1) and _int(index.get("chunk_size"), 1):
            index.setdefault("chunk_sizes", [s for _, s in cut_chunks(index["num_tokens"], index["chunk_size"])])
    missing = [k for k in INDEX_FIELDS if k not in index]
    if missing:
        raise ValueError(f"{path} is damaged: it lacks {', '.join(missing)}")
    for name in ("chunk_size", "num_chunks", "num_tokens", "world_size", "anchor_token_id", "pad_token_id",
                 "boundary_snap"):  # fmt: skip
        if not _int(index[name], 0 if name.endswith("token_id") or name == "boundary_snap" else 1):
            raise ValueError(f"{path} is damaged: {name}={index[name]!r} is not a valid integer")
    c, snap, sizes = index["chunk_size"], index["boundary_snap"], index["chunk_sizes"]
    if snap >= c:
        raise ValueError(f"{path} is damaged: boundary_snap={snap} is not below its chunk_size {c}")
    if not isinstance(sizes, list) or not all(_int(s, 1) and s <= c for s in sizes):
        raise ValueError(f"{path} is damaged: chunk_sizes must be a list of integers in [1, {c}]")
    if len(sizes) != index["num_chunks"] or sum(sizes) != index["num_tokens"]:
        raise ValueError(f"{path} is damaged: its chunk_sizes do not cut {index['num_tokens']} tokens into "
                         f"{index['num_chunks']} chunks")  # fmt: skip
    if not snap and sizes != [s for _, s in cut_chunks(index["num_tokens"], c)]:
        raise ValueError(f"{path} is damaged: fixed chunks of {c} tokens have other sizes than its chunk_sizes")
    for name in MODEL_FIELDS + ("version",):
        if not isinstance(index[name], str):
            raise ValueError(f"{path} is damaged: {name}={index[name]!r} is not a string")
    shards = index["shards"]
    if not isinstance(shards, list) or len(shards) != index["world_size"]:
        raise ValueError(f"{path} is damaged: its shard count disagrees with its world_size")
    nxt = 0
    for s in shards:
        ok = isinstance(s, dict) and all(_int(s.get(k), 0) for k in ("first_chunk", "num_chunks", "num_tokens"))
        ok = ok and isinstance(s.get("file"), str) and os.path.basename(s["file"]) == s["file"] and s["file"]
        ok = ok and s["file"] not in (".", "..") and isinstance(s.get("tensor_digest"), str)
        if not ok or s["first_chunk"] != nxt or s["num_chunks"] < 1:
            raise ValueError(f"{path} is damaged: its shards do not cut the chunks 0..N-1 in order")
        nxt += s["num_chunks"]
        if nxt > len(sizes) or s["num_tokens"] != sum(sizes[s["first_chunk"] : nxt]):
            raise ValueError(
                f"{path} is damaged: shard {s['file']} holds {s['num_tokens']} tokens, its chunks hold other"
            )
    if nxt != index["num_chunks"]:
        raise ValueError(f"{path} is damaged: its shards hold {nxt} chunks, the index says {index['num_chunks']}")
    return index


def spans_of(index: dict) -> list:
    """``(start, size)`` of every chunk of an index (:func:`read_index`)."""
    out, s = [], 0
    for size in index["chunk_sizes"]:
        out.append((s, size))
        s += size
    return out


def _check_model_fields(index: dict, model, path) -> None:
    have = model_fingerprint(model)
    for name in MODEL_FIELDS:
        if index.get(name) != have[name]:
            why = " (the model weights differ from those that encoded it)" if name == "model_weights" else ""
            raise ValueError(
                f"{name} mismatch: {path} was encoded with {name}={index.get(name)!r}, "
                f"the model has {have[name]!r}{why}"
            )


def _concat_rows(parts: list, index: dict, lo: int, hi: int) -> DocumentCache:
    """Rows ``[a, b)`` of each loaded shard ``(doc, a, b)``, in order: the :class:`DocumentCache` of chunks
    ``lo..hi-1``."""
    first = parts[0][0]
    if len(parts) == 1 and parts[0][1] == 0 and parts[0][2] == first.num_chunks:
        return first
    spans = spans_of(index)
    span_tokens = sum(size for _, size in spans[lo:hi])
    t = min(index["chunk_size"], span_tokens) + 1
    n_layers = len(first.chunks.k)
    cat = lambda ts, fill: torch.cat([fit_width(x, t, fill) for x in ts])  # noqa: E731
    k = [cat([d.chunks.k[i][a:b] for d, a, b in parts], 0) for i in range(n_layers)]
    v = [cat([d.chunks.v[i][a:b] for d, a, b in parts], 0) for i in range(n_layers)]
    ids = cat([d.chunks.ids[a:b] for d, a, b in parts], index["pad_token_id"])
    lens = torch.cat([d.chunks.lens[a:b] for d, a, b in parts])
    base = spans[lo][0]
    starts = [s - base for s, _ in spans[lo:hi]]
    return DocumentCache(ChunkCache(k, v, lens, starts, ids), first.chunk_size, first.anchor_token_id,
                         dict(first.fingerprint), first.version, first.boundary_snap)  # fmt: skip


def load_sharded(cls, path, model, *, group=None, verify: bool = True):
    """Open a sharded document written by :func:`save_sharded` on this group, whatever its world size.

    Collective. Each rank takes its share of the current group (:func:`shard_bounds`) and reads the
    rows it needs from the saved shards that hold them (one shard when the world size is the one
    that saved; parts of several otherwise), with :meth:`DocumentCache.load`'s checks (model
    fingerprint, layout, ``verify``: every tensor's SHA-256). Without a process group one process
    loads every shard (``.local`` is then the whole document).

    Args:
        cls: :class:`~dllm.distributed.ShardedDocument` (the class to build).

    Raises:
        RankError (in a group) or, in one process, the error itself: ``FileNotFoundError`` (index or
        a shard missing); ``ValueError``: not a sharded index, a field that differs from the model
        (named), a shard that is not the one the index recorded, fewer chunks than ranks.
    """
    rank, size = world(group)

    def load_local():
        index = read_index(path)
        _check_model_fields(index, model, path)
        bounds = shard_bounds(index["num_chunks"], size)
        lo, hi = bounds[rank]
        folder = os.path.dirname(os.path.abspath(os.fspath(path)))
        parts = []
        for s in index["shards"]:
            s0, s1 = s["first_chunk"], s["first_chunk"] + s["num_chunks"]
            if s1 <= lo or s0 >= hi:
                continue
            file = os.path.join(folder, s["file"])
            doc = DocumentCache.load(file, model, verify=verify, shard=True)
            head = DocumentCache.read_header(file, shard=True)
            if (
                _hashes_digest(head["tensor_sha256"]) != s["tensor_digest"]
                or doc.num_chunks != s["num_chunks"]
                or len(doc) != s["num_tokens"]
                or doc.chunk_size != index["chunk_size"]
                or doc.anchor_token_id != index["anchor_token_id"]
                or doc.boundary_snap != index["boundary_snap"]
                or doc.chunks.sizes() != index["chunk_sizes"][s0:s1]
            ):
                raise ValueError(
                    f"{file} is not the shard {path} recorded (other tensors, chunks, chunk size, boundary_snap or "
                    "anchor): encode the document again"
                )
            parts.append((doc, max(lo, s0) - s0, min(hi, s1) - s0))
        local = _concat_rows(parts, index, lo, hi)
        return cls(local, bounds, index["num_tokens"], index["pad_token_id"], group, spans_of(index))

    return run_on_all(load_local, group)
