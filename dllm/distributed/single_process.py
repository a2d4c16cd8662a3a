"""A saved document read in one process, whichever file it is: a document cache (one safetensors file) or
a sharded document's index (its shards re-split onto this one process, as any rank count may read them).
What ``python -m dllm generate --document`` reads without torchrun."""

from __future__ import annotations

import errno
import os

from dllm.distributed.index_file import load_sharded, read_index
from dllm.distributed.sharded_document import ShardedDocument
from dllm.prefilling.document import DocumentCache


def is_index(path) -> bool:
    """``path`` looks like a sharded document's JSON index rather than a safetensors document cache: its first
    byte (after a UTF-8 BOM and blanks) is ``{``, or ``[`` (a JSON array, which the index reader then refuses
    as not an object, naming the file), where a safetensors file starts with an 8-byte header length followed
    by ``{``. Only a regular file is opened (a FIFO would block)."""
    if not os.path.isfile(path):
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    if len(head) >= 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 1 << 40:
        return False  # safetensors: u64 header length, then the header's JSON
    return head.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n")[:1] in (b"{", b"[")


def load_document(path, model, *, verify: bool = True) -> DocumentCache:
    """A document cache file or a sharded document's index, in one process: the whole document.

    An index is read with every shard re-split onto this one process (:func:`load_sharded` without a group);
    any other path is :meth:`DocumentCache.load` (which refuses one shard alone and names the file).

    Raises:
        As :meth:`DocumentCache.load` and :func:`load_sharded`.
    """
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, "is a directory, not a document cache", os.fspath(path))
    if not is_index(path):
        return DocumentCache.load(path, model, verify=verify)
    return load_sharded(ShardedDocument, path, model, group=None, verify=verify).local


def read_document_header(path) -> dict:
    """The header of a saved document without reading its tensors: :meth:`DocumentCache.read_header` of a cache
    file, or :func:`~dllm.distributed.index_file.read_index` of a sharded index (both hold ``chunk_size``,
    ``num_tokens``, ``num_chunks`` and ``boundary_snap``).

    Raises:
        IsADirectoryError: a directory. FileNotFoundError: no such file. ValueError: as those two readers (one
        shard alone: load its index).
    """
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, "is a directory, not a document cache", os.fspath(path))
    return read_index(path) if is_index(path) else DocumentCache.read_header(path)
