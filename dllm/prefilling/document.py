"""``DocumentCache``: a document's chunked prefill, encoded once and reused for every question.

In independent cache mode a chunk's K/V depend on the chunk alone (BOS anchor + its tokens at
local positions), not on the question: the chunked prefill can be paid once per document and
reused across questions and processes (our extension of Prefilling-dLLM, arXiv 2606.10537; the
chunk encoding itself is the paper's). Answering from a document runs only what depends on the
question: the prefix, the draft, chunk scoring, selection and decoding::

    doc = dllm.encode_document(model, context_ids, chunk_size=256)
    doc.save("doc.cache")
    doc = dllm.DocumentCache.load("doc.cache", model)        # checked against the model, read into memory
    out = dllm.generate(model, method="prefilling", prompt=PromptParts(prefix, None, query),
                        document=doc, prefilling=cfg)

File format: one safetensors file. Tensors ``k.<layer>`` / ``v.<layer>`` (``[N, C+1, Hkv, D]``,
model dtype), ``lens`` (``[N]`` int32), ``starts`` (``[N]`` int64) and ``ids`` (``[N, C+1]`` int64,
the encoded tokens, needed by joint cache mode and causal scoring); the safetensors metadata holds
one JSON header under ``dllm_document_cache`` (:data:`HEADER_FIELDS`), with a SHA-256 of every
tensor's bytes (``tensor_sha256``) that :meth:`DocumentCache.load` checks by default, and
``boundary_snap``, the tolerance the chunk boundaries were snapped to sentence ends with
(``PrefillingConfig.boundary_snap``; 0 = fixed chunks). Files of older formats (no tokenizer identity)
are a ``ValueError`` that says to encode the document again.

Identity: a cache answers correctly only for the weights and the tokenizer that encoded it, so its
header carries a SHA-256 over every weight tensor of the model (a fine-tune, a LoRA merge or rows
swapped in place no longer match) and one over the tokenizer's vocabulary, merges and special tokens
(:mod:`dllm.prefilling.fingerprint`). The file is read by :mod:`dllm.prefilling.safetensors_file`.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from dllm.file_targets import current_umask, link_target
from dllm.model.devices import check_ids_for_model, same_device
from dllm.model.json_files import parse_json
from dllm.prefilling.chunks import (
    ChunkCache,
    cut_chunks,
    encode_chunks_as_configured,
    sentence_end_table,
    snapped_chunks,
)
from dllm.prefilling.config import PrefillingConfig, checkpoint_config, resolve_anchor_token_id
from dllm.prefilling.fingerprint import _dtype_name, _package_version, model_fingerprint, tensor_sha256
from dllm.prefilling.safetensors_file import _SafetensorsFile

# 2: model_weights hashes every weight tensor (1 hashed two rows of four), tensor_sha256 added.
# 3: boundary_snap added (chunk boundaries snapped to sentence ends).
# 4: tokenizer added (a cache of other token ids answered wrongly); older files cannot be checked, so are refused.
FORMAT = 4
READABLE_FORMATS = (4,)
HEADER_KEY = "dllm_document_cache"
# Checked against the model on load, in this order (the first mismatch is named in the error).
MODEL_FIELDS = ("family", "model_config", "dtype", "model_weights", "tokenizer")
HEADER_FIELDS = (
    "format",
    *MODEL_FIELDS,
    "chunk_size",
    "anchor_token_id",
    "num_chunks",
    "num_tokens",
    "version",
    "tensor_sha256",
    "boundary_snap",
)
_FIX_CONFIG = (
    "; PrefillingConfig(...) starts from the paper's defaults, not the checkpoint's: change settings over the "
    "checkpoint's defaults with PrefillingConfig.from_pretrained(model.model_dir, top_k=...), the way "
    "encode_document built the document's configuration (or encode the document with this config)"
)


@dataclass
class DocumentCache:
    """A document's chunk caches plus what they were encoded with.

    Attributes:
        chunks: the :class:`~dllm.prefilling.chunks.ChunkCache` (per layer K/V ``[N, C+1, Hkv, D]``).
        chunk_size: C used to cut the document.
        anchor_token_id: the BOS anchor put before every chunk.
        fingerprint: :func:`model_fingerprint` of the model that encoded it.
        version: the package version that encoded it.
        boundary_snap: ``PrefillingConfig.boundary_snap`` the chunks were cut with (0 = fixed chunks).
    """

    chunks: ChunkCache
    chunk_size: int
    anchor_token_id: int
    fingerprint: dict
    version: str
    boundary_snap: int = 0

    @property
    def num_chunks(self) -> int:
        """N, chunks in the document."""
        return self.chunks.num_chunks

    def __len__(self) -> int:
        """Context tokens of the document (anchors and padding not counted)."""
        return int(self.chunks.lens.sum()) - self.num_chunks

    @property
    def device(self) -> torch.device:
        return self.chunks.lens.device

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors (K/V of all layers, token ids, lengths)."""
        c = self.chunks
        return sum(t.numel() * t.element_size() for t in [*c.k, *c.v, c.ids, c.lens]) + 8 * len(c.starts)

    def header(self, tensor_hashes: dict[str, str] | None = None) -> dict:
        """The JSON header written by :meth:`save` (:data:`HEADER_FIELDS`); ``tensor_sha256`` holds
        ``tensor_hashes`` (name -> :func:`tensor_sha256`), empty when not given."""
        return {
            "format": FORMAT,
            **self.fingerprint,
            "chunk_size": self.chunk_size,
            "anchor_token_id": self.anchor_token_id,
            "num_chunks": self.num_chunks,
            "num_tokens": len(self),
            "version": self.version,
            "tensor_sha256": dict(sorted((tensor_hashes or {}).items())),
            "boundary_snap": self.boundary_snap,
        }

    def check_model(self, model) -> None:
        """Raise ``ValueError`` naming the first field of :data:`MODEL_FIELDS` that differs from ``model``'s,
        or when the cache and the model are on different devices."""
        _check_fields(self.fingerprint, model_fingerprint(model), "this document cache")
        if not same_device(self.device, model.device):
            raise ValueError(f"the document cache is on {self.device} but the model is on {model.device}")

    def check_config(self, cfg: PrefillingConfig, anchor_token_id: int) -> None:
        """Raise ``ValueError`` when ``cfg.chunk_size``, ``cfg.boundary_snap`` or the anchor differ from the
        document's."""
        if cfg.chunk_size != self.chunk_size:
            raise ValueError(
                f"chunk_size mismatch: the document was encoded with chunk_size={self.chunk_size}, "
                f"the prefilling config asks for {cfg.chunk_size}{_FIX_CONFIG}"
            )
        if cfg.boundary_snap != self.boundary_snap:
            raise ValueError(
                f"boundary_snap mismatch: the document's chunks were cut with boundary_snap={self.boundary_snap}, "
                f"the prefilling config asks for {cfg.boundary_snap}{_FIX_CONFIG}"
            )
        if anchor_token_id != self.anchor_token_id:
            raise ValueError(
                f"anchor_token_id mismatch: the document's chunks carry anchor {self.anchor_token_id}, "
                f"this run would use {anchor_token_id}"
            )

    def save(self, path) -> None:
        """Write the cache to ``path`` (one safetensors file with the JSON header in its metadata).

        The header records a SHA-256 of every tensor (checked by :meth:`load`). The file is written
        under a new name and renamed over ``path`` (a reader never sees half a file). A file that
        existed keeps its permission bits (a ``0o600`` cache stays private); a new one follows the
        process umask (``0o666 & ~umask``, as ``open`` would create it), so a cache can be shared
        across users and processes where the umask allows.

        Raises:
            OSError: the file cannot be written (its subclass and ``filename`` as for ``open``: e.g.
                ``FileNotFoundError`` for a missing folder, ``IsADirectoryError`` for a directory,
                ``FileExistsError`` for an existing device, FIFO or socket, never replaced;
                ``PermissionError`` for a symlink another user owns in a sticky world-writable folder
                such as ``/tmp``, not followed: :func:`dllm.file_targets.link_target`).
        """
        mode = 0o666 & ~current_umask()
        if os.path.lexists(path) and not os.path.isdir(path):
            target = link_target(path)
            if os.path.exists(target) and not os.path.isfile(target):
                # safetensors writes a temporary file and renames it over the target: a device node
                # (/dev/null) or what a symlink points to would be replaced, not written
                raise FileExistsError(errno.EEXIST, "exists and is not a regular file", str(path))
            path = target  # a symlink the caller may follow: write the file it names, keep the link
            if os.path.exists(target):
                mode = stat.S_IMODE(os.stat(target).st_mode)  # the rename would drop it
        c = self.chunks
        tensors = {f"k.{i}": k.contiguous() for i, k in enumerate(c.k)}
        tensors.update({f"v.{i}": v.contiguous() for i, v in enumerate(c.v)})
        tensors["lens"] = c.lens.contiguous()
        tensors["ids"] = c.ids.contiguous()
        tensors["starts"] = torch.tensor(c.starts, dtype=torch.int64)
        tensors = {k: t.cpu() for k, t in tensors.items()}
        hashes = {k: tensor_sha256(t) for k, t in tensors.items()}
        try:
            save_file(tensors, str(path), metadata={HEADER_KEY: json.dumps(self.header(hashes))})
        except SafetensorError as exc:  # safetensors reports I/O failures as its own error, with the errno in text
            code = re.search(r"os error (\d+)", str(exc))
            if code is None:
                raise OSError(f"cannot write the document cache {path}: {exc}") from None
            raise OSError(int(code[1]), os.strerror(int(code[1])), str(path)) from None
        os.chmod(path, mode)  # safetensors creates the file 0600

    @staticmethod
    def read_header(path, *, shard: bool = False) -> dict:
        """The JSON header of a cache file (:data:`HEADER_FIELDS`), without reading its tensors.

        Args:
            shard: accept one shard of a sharded document (:mod:`dllm.distributed`; its header has a ``shard``
                field), refused otherwise: its chunks are a part of a document, not the whole.

        Raises:
            FileNotFoundError: no such file. IsADirectoryError: a folder.
            ValueError: not a regular file (a FIFO, a device: refused without waiting on it), not a
                document cache of a known format (an integer), one shard of a sharded document, or a
                header with missing or ill-typed fields (the message names the file).
        """
        with _SafetensorsFile(path) as f:
            return _cache_header(f, path, shard=shard)

    @classmethod
    def load(cls, path, model=None, *, verify: bool = True, shard: bool = False) -> DocumentCache:
        """Read a cache written by :meth:`save`, for ``model`` (required: the model that will answer from
        it, whose fingerprint the file must match).

        The tensors are read into memory (on CPU; then copied to the model's device) through one open
        file: the loaded cache owns its bytes, so a file rewritten, replaced or truncated afterwards
        changes nothing (a file truncated while it is read is a ``ValueError``). Before any K/V byte
        is read, the file's tensor names, shapes and dtypes are checked against the header and the
        model, then its chunk lengths, offsets and token ids.

        Args:
            path: the cache file.
            model: the model loaded by :func:`dllm.load_model` that will answer from the cache: its
                family, config, dtype, weights and tokenizer must be those that encoded it.
            verify: check every tensor's bytes against the SHA-256 the header recorded at save time
                (default True: a bit flip, edited K/V or token ids, or K/V copied from another
                document are errors, not wrong answers). False checks only layout and token ids.
                Cost, for a 128K-token cache of the bundled model (267 MiB) on the 2-core CI machine,
                in CPU seconds: reading it into memory 0.20 s, hashing it another 0.18 s (~1.5 GB/s).
                Owning the bytes costs memory too: each process holds its own copy (a memory-mapped
                file shared the page cache).
            shard: accept one shard of a sharded document (:meth:`read_header`).

        Raises:
            TypeError: no model given.
            FileNotFoundError: no such file. IsADirectoryError: a folder.
            ValueError: not a regular file, not a document cache of a known format, a field of :data:`MODEL_FIELDS`
                differs from the model's (the message names it; ``model_weights``: the model
                weights differ from those that encoded the cache; ``tokenizer``: its tokenizer),
                or the file is damaged (tensors missing, extra or of the wrong shape or dtype,
                lengths or offsets that do not cut the header's token count, token ids that are not
                the anchor or lie outside the vocabulary, with ``verify``: a tensor whose bytes
                differ from the recorded hash) or was truncated while being read.
        """
        if model is None or not hasattr(model, "config"):
            raise TypeError(
                "DocumentCache.load(path, model) needs the model that will answer from the cache (from "
                "dllm.load_model): the file is checked against its weights, tokenizer and config"
            )
        with _SafetensorsFile(path) as f:
            head = _cache_header(f, path, shard=shard)
            _check_fields({k: head.get(k) for k in MODEL_FIELDS}, model_fingerprint(model), str(path))
            _check_tensor_layout(f, head, model, path)
            read = _verified_reader(f, head, path) if verify else f.read
            lens, ids = read("lens"), read("ids")
            starts = read("starts").tolist()
            _check_chunk_tokens(head, lens, starts, ids, model, path)
            n_layers = model.config.num_layers
            dev = model.device
            k = [read(f"k.{i}").to(dev) for i in range(n_layers)]
            v = [read(f"v.{i}").to(dev) for i in range(n_layers)]
        chunks = ChunkCache(k, v, lens.to(dev), starts, ids.to(dev))
        fingerprint = {k: head[k] for k in MODEL_FIELDS}
        return cls(
            chunks, head["chunk_size"], head["anchor_token_id"], fingerprint, head["version"], head["boundary_snap"]
        )


def _cache_header(f: _SafetensorsFile, path, *, shard: bool = False) -> dict:
    """The document cache header of an open file (see :meth:`DocumentCache.read_header`)."""
    raw = f.metadata().get(HEADER_KEY)
    if not isinstance(raw, str):
        raise ValueError(f"{path} is not a dllm document cache (no {HEADER_KEY!r} header)")
    head = parse_json(raw, f"{path} is damaged: its {HEADER_KEY!r} header")
    fmt = head.get("format")
    if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt not in READABLE_FORMATS:
        raise ValueError(
            f"format mismatch: {path} has format {fmt!r}, this version reads "
            f"{' and '.join(map(str, READABLE_FORMATS))}; encode the document again with this version"
        )
    if "shard" in head and not shard:
        of = head["shard"] if isinstance(head["shard"], dict) else {}
        raise ValueError(
            f"{path} is one shard of a sharded document, not a whole document: load its index "
            f"{of.get('index', '')!r} beside it (dllm.distributed.ShardedDocument.load; generate --document INDEX)"
        )
    _check_header(head, path)
    return head


def _verified_reader(f: _SafetensorsFile, head: dict, path):
    """``f.read`` that raises ``ValueError`` when a tensor's bytes differ from the header's hash."""
    hashes = head["tensor_sha256"]

    def read(name: str) -> torch.Tensor:
        h = hashlib.sha256()
        t = f.read(name, h)
        if hashes.get(name) != h.hexdigest():
            raise ValueError(
                f"{path} is damaged: the bytes of tensor {name} differ from the SHA-256 recorded when it was saved "
                "(edited, corrupted or copied from another cache); encode the document again"
            )
        return t

    return read


_INT_FIELDS = ("chunk_size", "anchor_token_id", "num_chunks", "num_tokens", "boundary_snap")
_ZERO_OK = ("anchor_token_id", "boundary_snap")


def _check_header(head: dict, path) -> None:
    """Every field of :data:`HEADER_FIELDS` present, the counts positive integers that agree."""
    missing = [name for name in HEADER_FIELDS if name not in head]
    if missing:
        raise ValueError(f"{path} is damaged: its header lacks {', '.join(missing)}")
    for name in _INT_FIELDS:
        value = head[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < (0 if name in _ZERO_OK else 1):
            raise ValueError(f"{path} is damaged: header field {name}={value!r} is not a valid integer")
    if not isinstance(head["version"], str) or not head["version"]:
        raise ValueError(f"{path} is damaged: header field version={head['version']!r} is not a version string")
    hashes = head["tensor_sha256"]
    if not isinstance(hashes, dict) or not all(
        isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v) for v in hashes.values()
    ):
        raise ValueError(f"{path} is damaged: header field tensor_sha256 is not a mapping of name -> SHA-256")
    if head["boundary_snap"] >= head["chunk_size"]:
        raise ValueError(f"{path} is damaged: boundary_snap={head['boundary_snap']} is not below its chunk_size")
    n = -(-head["num_tokens"] // head["chunk_size"])  # len(cut_chunks(...)) without building the list
    if head["boundary_snap"] and not n <= head["num_chunks"] <= head["num_tokens"]:
        raise ValueError(
            f"{path} is damaged: {head['num_tokens']} tokens in chunks of at most {head['chunk_size']} cannot be "
            f"{head['num_chunks']} chunks"
        )
    if not head["boundary_snap"] and head["num_chunks"] != n:
        raise ValueError(
            f"{path} is damaged: {head['num_tokens']} tokens in chunks of {head['chunk_size']} are {n} chunks, "
            f"its header says {head['num_chunks']}"
        )


def _check_tensor_layout(f, head: dict, model, path) -> None:
    """Names, shapes and dtypes of the file's tensors (read from the safetensors index, no data)."""
    c = model.config
    n, t = head["num_chunks"], min(head["chunk_size"], head["num_tokens"]) + 1
    want = {
        f"{kv}.{i}": ([n, t, c.num_kv_heads, c.head_dim], _dtype_name(model.dtype))
        for kv in "kv"
        for i in range(c.num_layers)
    }
    want.update(lens=([n], "int32"), starts=([n], "int64"), ids=([n, t], "int64"))
    names = set(f.keys())
    hashes = set(head["tensor_sha256"])
    if hashes != set(want):
        raise ValueError(
            f"{path} is damaged: its header's tensor_sha256 names {len(hashes)} tensors, the cache has {len(want)}"
        )
    if names != set(want):
        extra, lacking = sorted(names - set(want)), sorted(set(want) - names)
        what = "; ".join(
            p
            for p in (
                f"lacks {', '.join(lacking)}" if lacking else "",
                f"has unexpected {', '.join(extra)}" if extra else "",
            )
            if p
        )
        raise ValueError(f"{path} is damaged: it {what} (a {c.num_layers}-layer model's cache)")
    for name, (shape, dtype) in want.items():
        have_shape, have_dtype = f.shape(name), f.dtype(name)
        if have_shape != shape or have_dtype != dtype:
            raise ValueError(f"{path} is damaged: tensor {name} is {have_dtype} {have_shape}, expected {dtype} {shape}")


def _check_chunk_tokens(head: dict, lens, starts, ids, model, path) -> None:
    """Chunk lengths and offsets are those of cutting ``num_tokens`` into ``chunk_size`` chunks (snapped to the
    sentence ends of the cached tokens with ``boundary_snap``); every chunk starts with the anchor; the ids lie
    in the vocabulary and the context holds no mask token."""
    if head["boundary_snap"]:
        sizes = [int(n) - 1 for n in lens.tolist()]
        consistent = all(1 <= c <= head["chunk_size"] for c in sizes) and sum(sizes) == head["num_tokens"]
        if consistent and 0 <= int(ids.min()) and int(ids.max()) < model.config.vocab_size:
            context = torch.cat([ids[j, 1 : 1 + c] for j, c in enumerate(sizes)])
            spans = snapped_chunks(sentence_end_table(model)[context], head["chunk_size"], head["boundary_snap"])
        else:
            spans = []  # reported as damaged below
    else:
        spans = cut_chunks(head["num_tokens"], head["chunk_size"])
    if lens.tolist() != [size + 1 for _, size in spans] or starts != [s for s, _ in spans]:
        raise ValueError(
            f"{path} is damaged: its chunk lengths or offsets do not cut {head['num_tokens']} tokens into chunks of "
            f"{head['chunk_size']}"
            + (f" snapped to sentence ends within {head['boundary_snap']}" if head["boundary_snap"] else "")
        )
    anchor, vocab, mask = head["anchor_token_id"], model.config.vocab_size, model.mask_token_id
    if anchor >= vocab or anchor == mask:
        raise ValueError(f"{path} is damaged: anchor_token_id={anchor} is the mask id or outside the vocabulary")
    if bool((ids[:, 0] != anchor).any()):
        raise ValueError(f"{path} is damaged: not every chunk starts with the anchor token {anchor}")
    if bool((ids < 0).any()) or bool((ids >= vocab).any()):
        raise ValueError(f"{path} is damaged: token ids outside [0, {vocab})")
    context = torch.arange(ids.shape[1])[None, :] < lens[:, None]
    context[:, 0] = False
    if bool((ids[context] == mask).any()):
        raise ValueError(f"{path} is damaged: its context holds the mask token id {mask}")


_WHY = {
    "model_weights": " (the model weights differ from those that encoded it)",
    "tokenizer": " (the model's tokenizer differs from the one that encoded it: its token ids mean other text)",
}


def _check_fields(have: dict, want: dict, what: str) -> None:
    """Raise ``ValueError`` naming the first field of :data:`MODEL_FIELDS` where ``have`` differs from ``want``."""
    for name in MODEL_FIELDS:
        if have.get(name) != want[name]:
            why = _WHY.get(name, "")
            raise ValueError(
                f"{name} mismatch: {what} was encoded with {name}={have.get(name)!r}, the model has {want[name]!r}{why}"
            )


@torch.no_grad()
def encode_document(
    model,
    context_ids: torch.Tensor,
    chunk_size: int | None = None,
    *,
    prefilling: PrefillingConfig | None = None,
    progress: bool = False,
) -> DocumentCache:
    """Chunked prefill of a document, kept for later questions.

    Cuts ``context_ids`` into chunks of ``chunk_size`` tokens, puts the BOS anchor before each and
    encodes them independently at local positions (:func:`~dllm.prefilling.chunks.encode_chunks`),
    exactly as a fresh ``dllm.generate(method="prefilling")`` run with the same configuration
    would: answers from the document then equal fresh answers token for token (bit for bit when
    ``prefill_batch`` is the same; another batch may change the chunk K/V at round-off level).

    Args:
        model: the dLLM.
        context_ids: ``[L_ctx]`` int64 token ids on the model's device (no BOS: anchors are added).
        chunk_size: C (default ``prefilling.chunk_size``).
        prefilling: the configuration later answers will use (its ``chunk_size``, ``boundary_snap``,
            ``prefill_batch`` and ``anchor_token_id``); default: the checkpoint's
            (:meth:`PrefillingConfig.from_pretrained`), with ``chunk_size`` if given.
        progress: tqdm bar over chunk batches.

    Returns:
        A :class:`DocumentCache` on the model's device.

    Raises:
        TypeError: ``context_ids`` is not an integer tensor.
        ValueError: empty or non-1-D context, ids outside the vocabulary or the mask id, context on
            another device, ``chunk_size`` differing from ``prefilling.chunk_size``, no anchor token.
    """
    cfg = prefilling or checkpoint_config(model, chunk_size)
    if chunk_size is not None and chunk_size != cfg.chunk_size:
        raise ValueError(f"chunk_size={chunk_size} differs from prefilling.chunk_size={cfg.chunk_size}")
    if not torch.is_tensor(context_ids) or context_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError("context_ids must be an int64/int32 tensor of token ids")
    if context_ids.dim() != 1 or context_ids.numel() == 0:
        raise ValueError(f"context_ids must be a non-empty 1-D tensor, got shape {tuple(context_ids.shape)}")
    check_ids_for_model(model, context_ids, "context_ids are", "context_ids contain", "context")
    anchor, _source = resolve_anchor_token_id(model.config, model.tokenizer, cfg)
    (chunks,), _nfe, _per_row = encode_chunks_as_configured(model, [context_ids.long()], cfg, anchor, progress=progress)
    return DocumentCache(
        chunks, cfg.chunk_size, anchor, model_fingerprint(model), _package_version(), cfg.boundary_snap
    )
