"""``dllm.load_model``: a checkpoint directory -> a ready :class:`~dllm.model.modeling.DiffusionLM`.

Loading is unattended and runs no code from the checkpoint: the config is read as JSON
(:mod:`dllm.model.config`), the weights with safetensors, and the tokenizer through the
transformers class its ``tokenizer_config.json`` names, with ``trust_remote_code=False``.
(``AutoTokenizer`` would read the checkpoint's ``config.json`` and, seeing Dream's or LLaDA's
``auto_map``, ask "Do you wish to run the custom code? [y/N]" on a terminal or wait on an open stdin.)
"""

from __future__ import annotations

import os
import warnings

import torch

from dllm.model.config import ConfigError, load_config
from dllm.model.hf import quiet_transformers
from dllm.model.json_files import read_json
from dllm.model.modeling import DiffusionLM
from dllm.model.weights import check_checkpoint_shapes, checkpoint_index, checkpoint_num_layers, load_weights_into

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
    return os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets", "tiny-dream")


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


def _tokenizer_class(name: str | None, path: str, family: str | None):
    """The transformers tokenizer class for a ``tokenizer_class`` name, never a remote-code one.

    Order: the name's fast variant, the name itself, then for names transformers does not know
    (a remote-code class such as Dream's ``DreamTokenizer``, or ``TokenizersBackend``, the 5.x name
    4.46 lacks): ``PreTrainedTokenizerFast`` over ``tokenizer.json`` if present, else for the Dream
    family the Qwen2 BPE (``vocab.json`` + ``merges.txt``; Dream's tokenizer is Qwen2's).
    """
    import transformers

    base = transformers.PreTrainedTokenizerBase
    if name:
        for cand in [name] if name.endswith("Fast") else [name + "Fast", name]:
            cls = getattr(transformers, cand, None)
            if isinstance(cls, type) and issubclass(cls, base):
                return cls
    has = lambda f: os.path.isfile(os.path.join(path, f))
    if has("tokenizer.json"):
        fallback = transformers.PreTrainedTokenizerFast
    elif family == "dream" and has("vocab.json") and has("merges.txt"):
        fallback = transformers.Qwen2TokenizerFast
    else:
        raise ConfigError(
            f"{path}: tokenizer class {name!r} is not part of transformers {transformers.__version__} and the "
            "folder has no tokenizer.json; dllm never runs a checkpoint's own code (trust_remote_code=False)"
        )
    if name and name not in ("TokenizersBackend", "PreTrainedTokenizerFast"):
        warnings.warn(
            f"{path}: tokenizer class {name!r} is not in transformers (remote code, not run); "
            f"loading the files with {fallback.__name__} instead",
            stacklevel=3,
        )
    return fallback


def resolve_device_dtype(device=None, dtype=None) -> tuple[torch.device, torch.dtype]:
    """The device and dtype :func:`load_model` uses: ``cuda`` when available, else ``cpu``; bfloat16 on
    CUDA, float32 on CPU, unless given.

    Raises:
        ValueError: unsupported dtype.
    """
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return device, resolve_dtype(dtype)


def load_tokenizer(path: str, *, family: str | None = None):
    """The HF tokenizer of a directory, or None if it holds no tokenizer files.

    Loads through the class ``tokenizer_config.json`` names (see :func:`_tokenizer_class`) with
    ``trust_remote_code=False``: never prompts, never runs checkpoint code, and reads both the
    4.x and the 5.x file layouts.

    Args:
        path: directory with ``tokenizer.json`` and/or ``vocab.json`` + ``merges.txt``, and usually
            ``tokenizer_config.json``.
        family: ``"dream"`` / ``"llada"`` (enables the Qwen2 fallback for Dream's remote-code class).

    Raises:
        dllm.model.config.ConfigError: an unreadable ``tokenizer_config.json``, or a class transformers
            lacks with no file a standard class could read.
    """
    if not any(os.path.isfile(os.path.join(path, f)) for f in _TOKENIZER_FILES):
        return None
    name = None
    cfg_path = os.path.join(path, "tokenizer_config.json")
    if os.path.isfile(cfg_path):
        name = read_json(cfg_path, ConfigError).get("tokenizer_class")
    cls = _tokenizer_class(name, path, family)
    with quiet_transformers():
        return cls.from_pretrained(path, trust_remote_code=False)


def load_model(
    path: str | None = None,
    device=None,
    dtype=None,
    *,
    tokenizer_path: str | None = None,
    rope_theta: float | None = None,
) -> DiffusionLM:
    """Build a dLLM from a checkpoint directory's own ``config.json`` and safetensors.

    Args:
        path: checkpoint directory (Dream or LLaDA layout; single ``model.safetensors`` or
            sharded ``model.safetensors.index.json``). None = the bundled tiny model.
        device: target device (default: ``cuda`` when available, else ``cpu``).
        dtype: float32 / float16 / bfloat16 (or their names). Default: bfloat16 on CUDA,
            float32 on CPU (CPU half precision is slow and inaccurate).
        tokenizer_path: directory of an HF tokenizer (default: ``path`` itself).
        rope_theta: override of the checkpoint's RoPE base, for static NTK extrapolation past the
            training window (LongLLaDA, Liu et al. 2025, scales LLaDA's theta this way). The keys of
            cached chunks are re-positioned with the same frequencies.

    Returns:
        The model in eval mode with ``family``, ``mask_token_id``, ``shift_logits`` (from the
        config) and ``tokenizer`` (a transformers tokenizer, see :func:`load_tokenizer`, or None) attributes.

    Raises:
        dllm.model.config.ConfigError: missing/invalid config (a field of the wrong type or range, named),
            unknown family, unsupported RoPE scaling, a layer count the checkpoint's tensors do not
            have, unusable tokenizer files.
        dllm.model.weights.WeightError: missing/misnamed tensors, shape mismatch (checked from the
            safetensors headers before the model is allocated), a tensor stored in two shards, an
            integer-typed weight, an index that is not a mapping, an empty, truncated or corrupt
            safetensors file (the message names the file).
        ValueError: unsupported dtype.
    """
    path = default_model_dir() if path is None else str(path)
    cfg = load_config(path, rope_theta=rope_theta)
    device, dtype = resolve_device_dtype(device, dtype)
    # The checkpoint's headers are read before anything is built: a config.json whose sizes do not
    # match its tensors (num_hidden_layers=1e9, a wrong vocab_size) fails here, not in an allocation.
    index = checkpoint_index(path, cfg.family)
    have_layers = checkpoint_num_layers(index)
    if have_layers != cfg.num_layers:
        field = "num_hidden_layers" if cfg.family == "dream" else "n_layers"
        raise ConfigError(
            f"{os.path.join(path, 'config.json')}: {field}={cfg.num_layers} but the checkpoint's tensors hold "
            f"{have_layers} layer(s)"
        )
    with torch.device("meta"):
        model = DiffusionLM(cfg)
    if cfg.tie_word_embeddings:  # the tie is also what the shape check expects
        model.lm_head.weight = model.embed_tokens.weight
    check_checkpoint_shapes(model, index, path)
    model = model.to_empty(device=device).to(dtype)
    if cfg.tie_word_embeddings:  # to_empty breaks the tie
        model.lm_head.weight = model.embed_tokens.weight
    load_weights_into(model, path, cfg.family, index)
    model.eval()
    model.requires_grad_(False)
    if model.uses_fused_ops():  # the fused path's merged q/k/v and gate/up weights, laid out once, here
        model.merge_projections()
    model.tokenizer = load_tokenizer(tokenizer_path or path, family=cfg.family)
    model.model_dir = path
    return model
