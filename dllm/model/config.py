"""Model configuration: one dataclass for both dLLM families, read from a checkpoint's config.json.

Families:

- ``dream``: Qwen2 layout (Dream-v0-7B). q/k/v bias, GQA, RMSNorm, SwiGLU, RoPE,
  untied head, **shifted** logits (token i is predicted from position i-1).
- ``llada``: OLMo/Llama layout (LLaDA-8B). No bias, RoPE, SwiGLU, **unshifted** logits.

The checkpoint's own ``config.json`` fields are read as plain JSON (no remote code,
no transformers config class: transformers 5.x would move ``rope_theta`` and
``rope_scaling`` into ``rope_parameters`` on the way) and mapped onto
:class:`ModelConfig`. A config saved by transformers 5.x (``rope_parameters`` only)
is read as well. RoPE scaling: the static variants of :mod:`dllm.model.rope`.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field

from .json_files import read_json

FAMILIES = ("dream", "llada")

# model_type values (case-insensitive) that belong to each family.
_DREAM_TYPES = {"dream", "qwen2"}
_LLADA_TYPES = {"llada"}


class ConfigError(ValueError):
    """A checkpoint's config.json is missing, unreadable or describes an unsupported model."""


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a bidirectional dLLM decoder, family-independent.

    Attributes:
        family: ``"dream"`` or ``"llada"``.
        vocab_size: rows of the embedding and the LM head.
        hidden_size: model width.
        intermediate_size: SwiGLU inner width.
        num_layers: decoder blocks.
        num_heads: query heads (Hq).
        num_kv_heads: key/value heads (Hkv); ``num_heads % num_kv_heads == 0`` (GQA).
        head_dim: per-head width D (``hidden_size // num_heads``).
        rope_theta: RoPE base (the checkpoint's, or the ``rope_theta=`` override of :func:`load_config`).
        rms_norm_eps: RMSNorm epsilon.
        qkv_bias: whether q/k/v projections carry a bias (Dream: yes, LLaDA: no).
        tie_word_embeddings: LM head shares the embedding matrix.
        shift_logits: Dream-style shift (token i predicted at position i-1).
        mask_token_id: id of the [MASK] token used for diffusion.
        bos_token_id / eos_token_id / pad_token_id: special ids (may be None).
        max_position_embeddings: the positions the model was trained for (Dream
            ``max_position_embeddings``, LLaDA ``max_sequence_length``); YaRN/llama3 scaling reads it
            when ``rope_scaling`` has no ``original_max_position_embeddings``.
        rope_scaling: the checkpoint's ``rope_scaling`` dict of a static variant (``linear``, ``yarn``,
            ``llama3``; see :mod:`dllm.model.rope`), or None for plain RoPE.
    """

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    qkv_bias: bool
    tie_word_embeddings: bool
    shift_logits: bool
    mask_token_id: int
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    max_position_embeddings: int | None = None
    rope_scaling: dict | None = field(default=None, hash=False)

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ConfigError(f"unknown model family {self.family!r}; expected one of {FAMILIES}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"config field {name} must be an integer, got {value!r}")
            if value < 1:
                raise ConfigError(f"config field {name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads} (GQA)")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ConfigError(f"mask_token_id {self.mask_token_id} outside the vocabulary [0, {self.vocab_size})")
        if not (math.isfinite(self.rope_theta) and self.rope_theta > 0):
            raise ConfigError(f"config field rope_theta must be a finite number > 0, got {self.rope_theta}")
        if not (math.isfinite(self.rms_norm_eps) and self.rms_norm_eps > 0):
            raise ConfigError(f"config field rms_norm_eps must be a finite number > 0, got {self.rms_norm_eps}")
        for key, value in (self.rope_scaling or {}).items():
            # a zero, negative or infinite factor gives inf/NaN frequencies (and NaN logits), never a
            # usable model; the other numbers (beta_fast/slow, mscale, ...) must be finite and >= 0
            # (0 means "unset" for some of them in transformers)
            if key in ("rope_type", "type") or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            positive = key == "factor" or key.endswith("_factor")
            if not math.isfinite(value) or value < 0 or (positive and value == 0):
                bound = "> 0" if positive else ">= 0"
                raise ConfigError(f"config field rope_scaling.{key} must be a finite number {bound}, got {value!r}")
        from dllm.model.rope import RotaryEmbedding

        try:  # validates the RoPE fields; the one table of frequencies, kept for the model (see ``rope``)
            rope = RotaryEmbedding.from_config(self)
        except ValueError as e:
            raise ConfigError(str(e)) from e
        object.__setattr__(self, "_rope", rope)  # not a field: no part of eq/hash/repr

    @property
    def rope(self):
        """The :class:`dllm.model.rope.RotaryEmbedding` of this configuration, computed once when the config was
        built (validation and every model built from it share it: no second frequency computation)."""
        return self._rope

    @property
    def trained_positions(self) -> int | None:
        """Positions the model is meant to attend over: ``max_position_embeddings``, extended by a static
        ``rope_scaling`` factor (linear / yarn / llama3 scale ``original_max_position_embeddings``, or
        ``max_position_embeddings`` itself when the scaling names no original); None when unknown."""
        base = self.max_position_embeddings
        if not base:
            return None
        scaling = self.rope_scaling or {}
        factor = scaling.get("factor")
        kind = str(scaling.get("rope_type", scaling.get("type", "default")))
        if kind in ("linear", "yarn", "llama3") and isinstance(factor, (int, float)) and factor > 1:
            original = scaling.get("original_max_position_embeddings") or base
            return max(base, int(original * factor))
        return base

    @property
    def gqa_group(self) -> int:
        """G = Hq / Hkv, the query heads that share one KV head."""
        return self.num_heads // self.num_kv_heads

    def to_dict(self) -> dict:
        return asdict(self)


def rope_fields(raw: dict, default_theta: float) -> tuple[float, dict | None]:
    """``(rope_theta, rope_scaling)`` from a raw config dict.

    Reads the classic top-level ``rope_theta`` / ``rope_scaling`` fields (what Dream and LLaDA
    checkpoints carry), else transformers 5.x's ``rope_parameters`` dict (which holds the theta
    too). The returned scaling never holds ``rope_theta``; a scaling of type ``default`` is None.

    Raises:
        ConfigError: a ``rope_scaling`` that is not a JSON object.
    """
    params = raw.get("rope_parameters") if isinstance(raw.get("rope_parameters"), dict) else {}
    scaling = raw.get("rope_scaling")
    if scaling is None and params:
        scaling = params
    if scaling is not None and not isinstance(scaling, dict):
        raise ConfigError(f"rope_scaling must be a JSON object or null, got {scaling!r}")
    theta = raw.get("rope_theta")
    if theta is None:
        theta = (scaling or {}).get("rope_theta", default_theta)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        raise ConfigError(f"field 'rope_theta' must be a number, got {theta!r}")
    scaling = {k: v for k, v in (scaling or {}).items() if k != "rope_theta"}
    if scaling:
        from dllm.model.rope import rope_type_of

        if rope_type_of(scaling) == "default":
            scaling = None
    return float(theta), (scaling or None)


def _require(raw: dict, key: str, path: str):
    if key not in raw or raw[key] is None:
        raise ConfigError(f"{path}: required field {key!r} is missing")
    return raw[key]


def _int(raw: dict, key: str, path: str, *, default=None, minimum: int = 1) -> int | None:
    """A JSON integer field, ``>= minimum``; ``default`` when absent or null (required when ``default``
    is None). An integral float (``4096.0``, as some exporters write) is read as its integer; a bool, a
    string or a fractional number is an error. Sizes too large for the checkpoint (``1e9`` layers)
    fail later against its tensors, before anything is built."""
    value = raw.get(key)
    if value is None:
        if default is None:
            _require(raw, key, path)
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{path}: field {key!r} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{path}: field {key!r} must be >= {minimum}, got {value}")
    return value


def _optional_id(raw: dict, key: str, path: str) -> int | None:
    """A special token id field: an integer or null; a list (transformers allows several EOS ids) gives
    its first id; a negative id (older configs' ``-1`` for "none") is None."""
    value = raw.get(key)
    if isinstance(value, list):
        if not value:
            return None
        value = value[0]
    if value is None:
        return None
    ident = _int({key: value}, key, path, minimum=-(2**62))
    return ident if ident >= 0 else None


def _positive_float(raw: dict, key: str, path: str, default: float) -> float:
    """A finite, positive JSON number (``rms_norm_eps``)."""
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{path}: field {key!r} must be a finite number > 0, got {value!r}")
    return float(value)


def family_of(raw: dict) -> str:
    """Family of a raw config dict from its ``model_type`` (or ``architectures``).

    Raises:
        ConfigError: when neither names a supported family.
    """
    mt = str(raw.get("model_type", "")).lower()
    if mt in _DREAM_TYPES:
        return "dream"
    if mt in _LLADA_TYPES:
        return "llada"
    arch = " ".join(raw.get("architectures") or []).lower()
    if "dream" in arch or "qwen2" in arch:
        return "dream"
    if "llada" in arch:
        return "llada"
    raise ConfigError(
        f"unknown model family: model_type={raw.get('model_type')!r}, architectures={raw.get('architectures')!r}; "
        "supported: Dream (model_type 'Dream'/'qwen2') and LLaDA (model_type 'llada')"
    )


def _dream_config(raw: dict, path: str) -> ModelConfig:
    hidden = _int(raw, "hidden_size", path)
    heads = _int(raw, "num_attention_heads", path)
    if raw.get("use_sliding_window"):
        raise ConfigError(f"{path}: sliding-window attention is not supported (use_sliding_window=true)")
    theta, scaling = rope_fields(raw, 1e6)
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"{path}: hidden_act {act!r} is not supported (SwiGLU with silu only)")
    return ModelConfig(
        family="dream",
        vocab_size=_int(raw, "vocab_size", path),
        hidden_size=hidden,
        intermediate_size=_int(raw, "intermediate_size", path),
        num_layers=_int(raw, "num_hidden_layers", path),
        num_heads=heads,
        num_kv_heads=_int(raw, "num_key_value_heads", path, default=heads),
        head_dim=_int(raw, "head_dim", path, default=hidden // heads),
        rope_theta=theta,
        rms_norm_eps=_positive_float(raw, "rms_norm_eps", path, 1e-6),
        qkv_bias=True,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        shift_logits=True,
        **_token_ids(raw, path),
        max_position_embeddings=_int(raw, "max_position_embeddings", path, default=0) or None,
        rope_scaling=scaling,
    )


def _token_ids(raw: dict, path: str) -> dict:
    """The special token ids both families name alike: mask (required), bos, eos and pad (optional)."""
    return dict(
        mask_token_id=_int(raw, "mask_token_id", path, minimum=0),
        bos_token_id=_optional_id(raw, "bos_token_id", path),
        eos_token_id=_optional_id(raw, "eos_token_id", path),
        pad_token_id=_optional_id(raw, "pad_token_id", path),
    )


def _llada_config(raw: dict, path: str) -> ModelConfig:
    checks = {
        "block_type": ("llama", raw.get("block_type", "llama")),
        "layer_norm_type": ("rms", raw.get("layer_norm_type", "rms")),
        "activation_type": ("silu", raw.get("activation_type", "silu")),
    }
    for key, (want, got) in checks.items():
        if got != want:
            raise ConfigError(f"{path}: {key}={got!r} is not supported (only {want!r})")
    if raw.get("alibi"):
        raise ConfigError(f"{path}: ALiBi is not supported (alibi=true)")
    if raw.get("rope") is False:
        raise ConfigError(f"{path}: models without RoPE are not supported (rope=false)")
    if raw.get("include_bias"):
        raise ConfigError(f"{path}: include_bias=true is not supported for LLaDA")
    d_model = _int(raw, "d_model", path)
    heads = _int(raw, "n_heads", path)
    mlp = _int(raw, "mlp_hidden_size", path, default=0) or _int(raw, "mlp_ratio", path, default=4) * d_model
    vocab = _int(raw, "embedding_size", path, default=0) or _int(raw, "vocab_size", path)
    theta, scaling = rope_fields(raw, 10000.0)
    return ModelConfig(
        family="llada",
        vocab_size=vocab,
        hidden_size=d_model,
        intermediate_size=mlp,
        num_layers=_int(raw, "n_layers", path),
        num_heads=heads,
        num_kv_heads=_int(raw, "n_kv_heads", path, default=heads),
        head_dim=d_model // heads,
        rope_theta=theta,
        rms_norm_eps=_positive_float(raw, "rms_norm_eps", path, 1e-5),
        qkv_bias=bool(raw.get("include_qkv_bias", False)),
        tie_word_embeddings=bool(raw.get("weight_tying", False)),
        shift_logits=False,
        **_token_ids(raw, path),
        max_position_embeddings=_int(raw, "max_sequence_length", path, default=0) or None,
        rope_scaling=scaling,
    )


def read_raw_config(model_dir: str) -> dict:
    """The checkpoint's config.json as a plain dict, exactly as written (no transformers config class).

    Raises:
        ConfigError: missing directory/file, invalid JSON, or not a JSON object.
    """
    path = os.path.join(model_dir, "config.json")
    if not os.path.isdir(model_dir):
        raise ConfigError(f"model directory {model_dir!r} does not exist")
    if not os.path.isfile(path):
        raise ConfigError(f"{model_dir!r} has no config.json")
    return read_json(path, ConfigError)


def read_generation_config(model_dir: str) -> dict:
    """``generation_config.json`` of a checkpoint as a dict ({} when absent).

    Raises:
        ConfigError: invalid JSON, or JSON that is not an object.
    """
    path = os.path.join(model_dir, "generation_config.json")
    if not os.path.isfile(path):
        return {}
    return read_json(path, ConfigError)


def load_config(model_dir: str, *, rope_theta: float | None = None) -> ModelConfig:
    """Read ``model_dir/config.json`` into a :class:`ModelConfig`.

    Args:
        model_dir: checkpoint directory (Dream or LLaDA layout).
        rope_theta: override of the checkpoint's RoPE base (static NTK extrapolation beyond the
            training window, e.g. LongLLaDA's larger theta for LLaDA); None keeps the checkpoint's.

    Raises:
        ConfigError: missing/invalid file, unknown family, missing required field,
            or an architecture option this package does not implement (sliding window, a
            dynamic/longrope ``rope_scaling``, ...).
    """
    raw = read_raw_config(model_dir)
    path = os.path.join(model_dir, "config.json")
    if raw.get("bos_token_id") is None:  # LLaDA keeps its BOS id in generation_config.json only
        raw["bos_token_id"] = read_generation_config(model_dir).get("bos_token_id")
    if rope_theta is not None:
        raw["rope_theta"] = rope_theta
    family = family_of(raw)
    build = _dream_config if family == "dream" else _llada_config
    try:
        return build(raw, path)
    except ConfigError as e:
        if path in str(e):
            raise
        raise ConfigError(f"{path}: {e}") from e
    except (TypeError, ValueError) as e:  # e.g. "hidden_size": "big"
        raise ConfigError(f"{path}: invalid field value ({e})") from e
