"""Reading a document cache's safetensors file: the header first, then each tensor, hashed as it is read.

A file that is not a regular file (a FIFO, a device) or a header past safetensors' own limit is refused
before anything is read; each tensor is read into memory of its own in pieces hashed while still in the
CPU cache, so a loaded cache never follows its file (another process rewriting it changes nothing).
"""

from __future__ import annotations

import errno
import math
import os
import stat

import torch

from dllm.model.json_files import parse_json
from dllm.prefilling.fingerprint import _dtype_name

_READ_PIECE = 1 << 22  # bytes read (and hashed) per piece of a tensor: hashed while still in the CPU cache
_HEADER_LIMIT = 100_000_000  # bytes of a safetensors JSON header (the limit safetensors itself enforces)

_DTYPES = {  # safetensors dtype code -> torch dtype (those a document cache can hold)
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
}


class _SafetensorsFile:
    """A safetensors file read through one open descriptor: its header parsed on open, each tensor read
    into memory that the caller owns (never memory-mapped: a mapped file rewritten by another process
    changes the tensors, and one truncated kills the process with SIGBUS). Layout of the format: an
    8-byte little-endian header length, the JSON header (``__metadata__`` and, per tensor, ``dtype``,
    ``shape`` and ``data_offsets`` into the byte buffer that follows)."""

    def __init__(self, path):
        self.path = str(path)
        # O_NONBLOCK: a FIFO given as the cache must not wait for a writer (no effect on a regular file)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            if stat.S_ISDIR(mode):
                raise IsADirectoryError(errno.EISDIR, "a directory, not a document cache file", self.path)
            raise ValueError(f"{self.path} is not a dllm document cache (not a regular file)")
        self.file = os.fdopen(fd, "rb", buffering=0)
        try:
            self._read_index()
        except BaseException:
            self.file.close()
            raise

    def _not_safetensors(self, why: str) -> ValueError:
        return ValueError(f"{self.path} is not a dllm document cache (not a safetensors file: {why})")

    def _read_index(self) -> None:
        size = os.fstat(self.file.fileno()).st_size
        raw = self.file.read(8)
        if len(raw) < 8:
            raise self._not_safetensors("shorter than its 8-byte header length")
        n = int.from_bytes(raw, "little")
        if n > min(size - 8, _HEADER_LIMIT):
            raise self._not_safetensors(f"a header of {n} bytes in a file of {size}")
        try:
            index = parse_json(self.file.read(n), "its header")
        except ValueError as exc:
            raise self._not_safetensors(str(exc)) from None
        meta = index.pop("__metadata__", None) or {}
        if not isinstance(meta, dict):
            raise self._not_safetensors("its __metadata__ is not an object")
        self.data_start, data_len = 8 + n, size - 8 - n
        self.tensors = {name: e for name, e in index.items() if _valid_entry(e)}
        if len(self.tensors) < len(index):
            bad = next(name for name in index if name not in self.tensors)
            raise self._not_safetensors(f"tensor {bad!r} has no valid dtype, shape and offsets")
        for name, e in self.tensors.items():
            if e["data_offsets"][1] > data_len:
                raise ValueError(f"{self.path} is damaged: it ends before tensor {name} ends (truncated)")
        self.meta = meta

    def keys(self) -> list[str]:
        return list(self.tensors)

    def metadata(self) -> dict:
        return self.meta

    def shape(self, name: str) -> list[int]:
        return list(self.tensors[name]["shape"])

    def dtype(self, name: str) -> str:
        """The torch dtype name (``float32``), or the safetensors code when the cache never holds that dtype."""
        code = self.tensors[name]["dtype"]
        return _dtype_name(_DTYPES[code]) if code in _DTYPES else code

    def read(self, name: str, h=None) -> torch.Tensor:
        """The tensor ``name`` on the CPU, in memory of its own; ``h`` (a ``hashlib`` hash), when given, is
        updated with its bytes as they arrive (each piece hashed while it is in the CPU cache).

        Raises:
            ValueError: the header's offsets disagree with the shape, or the file ends inside the tensor
                (truncated since it was opened).
        """
        e = self.tensors[name]
        dtype, shape = _DTYPES[e["dtype"]], e["shape"]  # the layout check has vetted dtypes before any read
        begin, end = e["data_offsets"]
        nbytes = math.prod(shape) * dtype.itemsize
        if end - begin != nbytes:
            raise ValueError(f"{self.path} is damaged: tensor {name} holds {end - begin} bytes, its shape {nbytes}")
        t = torch.empty(shape, dtype=dtype)
        buf = memoryview(t.reshape(-1).view(torch.uint8).numpy())
        self.file.seek(self.data_start + begin)
        got = 0
        while got < nbytes:
            n = self.file.readinto(buf[got : got + _READ_PIECE])
            if not n:
                raise ValueError(
                    f"{self.path} is damaged: it ends inside tensor {name} (truncated, or rewritten while it was read)"
                )
            if h is not None:
                h.update(buf[got : got + n])
            got += n
        return t

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> _SafetensorsFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _valid_entry(e) -> bool:
    """A safetensors header entry with a dtype code, a shape of sizes >= 0 and two ordered offsets >= 0."""
    if not (isinstance(e, dict) and isinstance(e.get("dtype"), str) and isinstance(e.get("shape"), list)):
        return False
    offsets, is_int = e.get("data_offsets"), lambda x: isinstance(x, int) and not isinstance(x, bool)
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(is_int, offsets))):
        return False
    return all(is_int(d) and d >= 0 for d in e["shape"]) and 0 <= offsets[0] <= offsets[1]
