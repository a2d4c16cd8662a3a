"""Who encoded a document cache: digests of a model's weights, configuration and tokenizer.

A cache answers correctly only for the weights and the tokenizer that encoded it, so its header carries
:func:`model_fingerprint`: a SHA-256 over every weight tensor (:func:`weights_digest`; a fine-tune, a LoRA
merge or rows swapped in place no longer match), one over the model configuration, the dtype, and one over
the tokenizer's vocabulary, merges and special tokens (:func:`tokenizer_digest`). The weights' digest is
computed once per model and re-derived only when a cheap position-dependent checksum of a tensor changes
(:func:`_value_key`). :func:`tensor_sha256` also hashes the tensors a cache file holds.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from importlib import metadata

import torch

from dllm.model.tokenization import tokenizer_state_key

_HASH_BLOCK = 1 << 26  # bytes hashed per piece: bounds the host copy of a GPU tensor to 64 MiB
_MIX_BLOCK = 1 << 20  # elements per piece of :func:`_value_key` (bounds its int64 temporaries to 8 MiB)


def _package_version() -> str:
    try:
        return metadata.version("prefilling-dllm")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree not installed
        return "unknown"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tensor_sha256(t: torch.Tensor, h=None) -> str:
    """SHA-256 (hex) of a tensor's bytes in row-major order, on any device (copied to the host in
    64 MiB pieces); ``h`` is updated instead when given (its hexdigest is then returned)."""
    h = hashlib.sha256() if h is None else h
    flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
    for i in range(0, flat.numel(), _HASH_BLOCK):
        h.update(flat[i : i + _HASH_BLOCK].cpu().numpy().data)
    return h.hexdigest()


_MIXERS: dict[torch.device, torch.Tensor] = {}  # device -> the int64 multipliers of _value_key


def _mixers(device: torch.device) -> torch.Tensor:
    """``[_MIX_BLOCK]`` int64 odd multipliers, one unrelated pseudo-random value per position (a
    splitmix64-style mix of the position with torch's arithmetic shifts, which leave 62 random bits;
    products wrap modulo 2**64), made once per device."""
    w = _MIXERS.get(device)
    if w is None:
        x = torch.arange(_MIX_BLOCK, dtype=torch.int64, device=device) + 1
        for mult, shift in ((-7046029254386353131, 30), (-4658895280553007687, 27), (-7723592293110705685, 31)):
            x = x * mult  # 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB as signed int64
            x = x ^ (x >> shift)
        w = _MIXERS[device] = x | 1
    return w


def _value_key(t: torch.Tensor) -> int:
    """A fast, position-dependent checksum of a tensor's bit patterns (what :func:`weights_digest` keys its
    cached SHA-256 on): sum over elements of bits * an odd multiplier of the element's position, modulo
    2**64. Any one changed element changes it (an odd multiplier is invertible modulo 2**64), and so,
    unlike a plain sum, do swapped elements or rows (equal only if the multipliers of the two positions
    collide, about 2**-32 per swap). Not a cryptographic hash: it guards against accidents, the SHA-256
    it keys is what the file records. One read of the tensor plus two int64 passes, on its own device."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    flat = t.detach().reshape(-1).view(ints)
    w = _mixers(flat.device)
    acc = torch.zeros((), dtype=torch.int64, device=flat.device)
    for b, i in enumerate(range(0, flat.numel(), _MIX_BLOCK)):
        piece = flat[i : i + _MIX_BLOCK]
        acc += (piece.long() * w[: piece.numel()]).sum() * _piece_mixer(b)
    return int(acc)


def _piece_mixer(b: int) -> int:
    """An odd multiplier for piece ``b`` of :func:`_value_key` (a finaliser unrelated to :func:`_mixers`'), as a
    signed int64: elements at the same offset of two pieces get unrelated multipliers."""
    x = (b * 0xD1B54A32D192ED03 + 0x8CB92BA72F3D8DD7) % 2**64
    x = ((x ^ (x >> 32)) * 0xD6E8FEB86659FD93) % 2**64
    x = (x ^ (x >> 32)) | 1
    return x - 2**64 if x >= 2**63 else x


def weights_digest(model) -> str:
    """SHA-256 (hex) over every tensor of ``model.state_dict()``: names, dtypes, shapes and bytes.

    Computed once per model and cached on it. The cache is keyed by each tensor's storage address
    and a position-dependent checksum of its bit patterns (:func:`_value_key`: one
    fast read of the weights, no hashing), so weights changed in place by any route (``p.add_``,
    ``p.data += delta`` as LoRA merges do, two rows of the embedding swapped) or replaced are hashed
    again. Cost: the first call hashes the weights at SHA-256 speed (about 1-2 GB/s on one CPU core;
    ~10 s for a 7B model in bf16, plus the device-to-host copy on a GPU); every call (each encode,
    load, and answer from a document) reads them once for the key (0.01 s for the bundled model on
    the 2-core CI machine).
    """
    state = model.state_dict(keep_vars=True)
    # no version counter in the key: `p.data += delta` bumps none, and inference tensors have none to read
    key = tuple((name, t.data_ptr(), t.dtype, tuple(t.shape), _value_key(t)) for name, t in state.items())
    cached = getattr(model, "_dllm_weights_digest", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    h = hashlib.sha256()
    for name, t in state.items():
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        tensor_sha256(t, h)
    digest = h.hexdigest()
    try:
        model._dllm_weights_digest = (key, digest)
    except AttributeError:  # pragma: no cover - a model class that forbids new attributes
        pass
    return digest


# Parts of a tokenizers-library serialisation that do not change the ids of plain text without special
# tokens (what a document is encoded as): runtime padding and truncation (transformers sets them per call)
# and the post-processor (it only adds special tokens, which dllm places itself).
_TOKENIZER_RUNTIME = ("padding", "truncation", "post_processor")


def tokenizer_digest(tokenizer) -> str:
    """SHA-256 (hex) of what maps text to token ids and back: the tokenizer's serialised vocabulary,
    merges, normaliser, pre-tokeniser, decoder and added tokens (its ``tokenizer.json`` as the
    ``tokenizers`` library holds it; the sorted vocabulary for a slow tokenizer), and its special
    tokens. ``"none"`` for a model without a tokenizer. Two tokenizers with the same files give the
    same digest wherever they were loaded from; one with two ids swapped does not.
    """
    if tokenizer is None:
        return "none"
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        state = json.loads(backend.to_str())
        for name in _TOKENIZER_RUNTIME:
            state.pop(name, None)
    else:  # a slow (Python) tokenizer: its vocabulary is what it exposes
        state = {"vocab": sorted(tokenizer.get_vocab().items())}
    state["special_tokens"] = {k: str(v) for k, v in sorted(tokenizer.special_tokens_map.items())}
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()


def _model_tokenizer_digest(model) -> str:
    """:func:`tokenizer_digest` of ``model.tokenizer``, cached on the model while the same tokenizer object
    has the same :func:`~dllm.model.tokenization.tokenizer_state_key` (``add_tokens``, a new special token, a
    replaced normaliser, pre-tokeniser, decoder, post-processor or model computes it again)."""
    tok = getattr(model, "tokenizer", None)
    key = tokenizer_state_key(tok)
    cached = getattr(model, "_dllm_tokenizer_digest", None)
    if cached is not None and cached[0] is tok and cached[1] == key:
        return cached[2]
    digest = tokenizer_digest(tok)
    try:
        model._dllm_tokenizer_digest = (tok, key, digest)
    except AttributeError:  # pragma: no cover - a model class that forbids new attributes
        pass
    return digest


def model_fingerprint(model) -> dict[str, str]:
    """What a document cache must match: ``{family, model_config, dtype, model_weights, tokenizer}``.

    ``model_config`` is a SHA-256 of the :class:`~dllm.model.config.ModelConfig` fields; ``model_weights``
    the :func:`weights_digest` of every weight tensor (cached per model); ``tokenizer`` the
    :func:`tokenizer_digest` of ``model.tokenizer`` (cached per model and tokenizer).
    """
    cfg_json = json.dumps(asdict(model.config), sort_keys=True)
    return {
        "family": model.family,
        "model_config": hashlib.sha256(cfg_json.encode()).hexdigest()[:16],
        "dtype": _dtype_name(model.dtype),
        "model_weights": weights_digest(model)[:32],
        "tokenizer": _model_tokenizer_digest(model)[:32],
    }


# How to build a config that matches a document encoded with the checkpoint's defaults (PrefillingConfig(...)
# starts from the paper's defaults, C=1024, not from the checkpoint's prefilling_config.json).
