"""``dllm.load_model``: a checkpoint directory -> a ready :class:`~dllm.modeling.DiffusionLM`."""

from __future__ import annotations

import os

import torch

from dllm.config import load_config, quiet_transformers
from dllm.modeling import DiffusionLM
from dllm.weights import load_weights_into

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")


def default_model_dir() -> str:
    """Path of the bundled tiny Dream-layout model (``dllm/assets/tiny-dream``)."""
    return os.path.join(os.path.dirname(__file__), "assets", "tiny-dream")


def resolve_dtype(dtype) -> torch.dtype:
    """``torch.dtype`` from a dtype or its name (float32/fp32, float16/fp16, bfloat16/bf16).

    Raises:
        ValueError: any other dtype.
    """
    if isinstance(dtype, torch.dtype):
        if dtype in _DTYPES.values():
            return dtype
    elif isinstance(dtype, str) and dtype.lower() in _DTYPES:
        return _DTYPES[dtype.lower()]
    raise ValueError(f"unsupported dtype {dtype!r}; use float32, float16 or bfloat16")


def load_tokenizer(path: str):
    """``transformers.AutoTokenizer`` from a directory, or None if it holds no tokenizer files."""
    if not any(os.path.isfile(os.path.join(path, f)) for f in _TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    with quiet_transformers():
        return AutoTokenizer.from_pretrained(path)


def load_model(path: str | None = None, device=None, dtype=None, *, tokenizer_path: str | None = None) -> DiffusionLM:
    """Build a dLLM from a checkpoint directory's own ``config.json`` and safetensors.

    Args:
        path: checkpoint directory (Dream or LLaDA layout; single ``model.safetensors`` or
            sharded ``model.safetensors.index.json``). None = the bundled tiny model.
        device: target device (default: ``cuda`` when available, else ``cpu``).
        dtype: float32 / float16 / bfloat16 (or their names). Default: bfloat16 on CUDA,
            float32 on CPU (CPU half precision is slow and inaccurate).
        tokenizer_path: directory of an HF tokenizer (default: ``path`` itself).

    Returns:
        The model in eval mode with ``family``, ``mask_token_id``, ``shift_logits`` (from the
        config) and ``tokenizer`` (an ``AutoTokenizer`` or None) attributes.

    Raises:
        dllm.config.ConfigError: missing/invalid config, unknown family.
        dllm.weights.WeightError: missing/misnamed tensors, shape mismatch.
        ValueError: unsupported dtype.
    """
    path = default_model_dir() if path is None else str(path)
    cfg = load_config(path)
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    dtype = resolve_dtype(dtype)
    with torch.device("meta"):
        model = DiffusionLM(cfg)
    model = model.to_empty(device=device).to(dtype)
    if cfg.tie_word_embeddings:  # to_empty breaks the tie
        model.lm_head.weight = model.embed_tokens.weight
    load_weights_into(model, path, cfg.family)
    model.eval()
    model.requires_grad_(False)
    model.tokenizer = load_tokenizer(tokenizer_path or path)
    model.model_dir = path
    return model
