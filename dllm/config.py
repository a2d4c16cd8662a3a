"""Model configuration: one dataclass for both dLLM families, read from a checkpoint's config.json.

Families (DESIGN section 4):

- ``dream``: Qwen2 layout (Dream-v0-7B). q/k/v bias, GQA, RMSNorm, SwiGLU, RoPE,
  untied head, **shifted** logits (token i is predicted from position i-1).
- ``llada``: OLMo/Llama layout (LLaDA-8B). No bias, RoPE, SwiGLU, **unshifted** logits.

The file is parsed with ``transformers.PretrainedConfig.from_json_file`` (no remote
code is run) and mapped onto :class:`ModelConfig`.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from dataclasses import asdict, dataclass

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
        rope_theta: RoPE base.
        rms_norm_eps: RMSNorm epsilon.
        qkv_bias: whether q/k/v projections carry a bias (Dream: yes, LLaDA: no).
        tie_word_embeddings: LM head shares the embedding matrix.
        shift_logits: Dream-style shift (token i predicted at position i-1).
        mask_token_id: id of the [MASK] token used for diffusion.
        bos_token_id / eos_token_id / pad_token_id: special ids (may be None).
        max_position_embeddings: the positions the model was trained for (informational).
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

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ConfigError(f"unknown model family {self.family!r}; expected one of {FAMILIES}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"config field {name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads} (GQA)")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ConfigError(f"mask_token_id {self.mask_token_id} outside the vocabulary [0, {self.vocab_size})")

    @property
    def gqa_group(self) -> int:
        """G = Hq / Hkv, the query heads that share one KV head."""
        return self.num_heads // self.num_kv_heads

    def to_dict(self) -> dict:
        return asdict(self)


def _require(raw: dict, key: str, path: str):
    if key not in raw or raw[key] is None:
        raise ConfigError(f"{path}: required field {key!r} is missing")
    return raw[key]


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
    hidden = int(_require(raw, "hidden_size", path))
    heads = int(_require(raw, "num_attention_heads", path))
    if raw.get("use_sliding_window"):
        raise ConfigError(f"{path}: sliding-window attention is not supported (use_sliding_window=true)")
    if raw.get("rope_scaling"):
        raise ConfigError(f"{path}: rope_scaling {raw['rope_scaling']!r} is not supported")
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"{path}: hidden_act {act!r} is not supported (SwiGLU with silu only)")
    return ModelConfig(
        family="dream",
        vocab_size=int(_require(raw, "vocab_size", path)),
        hidden_size=hidden,
        intermediate_size=int(_require(raw, "intermediate_size", path)),
        num_layers=int(_require(raw, "num_hidden_layers", path)),
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or hidden // heads),
        rope_theta=float(raw.get("rope_theta", 1e6)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        qkv_bias=True,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        shift_logits=True,
        mask_token_id=int(_require(raw, "mask_token_id", path)),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_id=raw.get("eos_token_id"),
        pad_token_id=raw.get("pad_token_id"),
        max_position_embeddings=raw.get("max_position_embeddings"),
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
    d_model = int(_require(raw, "d_model", path))
    heads = int(_require(raw, "n_heads", path))
    mlp = raw.get("mlp_hidden_size") or int(raw.get("mlp_ratio", 4)) * d_model
    vocab = int(raw.get("embedding_size") or _require(raw, "vocab_size", path))
    return ModelConfig(
        family="llada",
        vocab_size=vocab,
        hidden_size=d_model,
        intermediate_size=int(mlp),
        num_layers=int(_require(raw, "n_layers", path)),
        num_heads=heads,
        num_kv_heads=int(raw.get("n_kv_heads") or heads),
        head_dim=d_model // heads,
        rope_theta=float(raw.get("rope_theta", 10000.0)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
        qkv_bias=bool(raw.get("include_qkv_bias", False)),
        tie_word_embeddings=bool(raw.get("weight_tying", False)),
        shift_logits=False,
        mask_token_id=int(_require(raw, "mask_token_id", path)),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_id=raw.get("eos_token_id"),
        pad_token_id=raw.get("pad_token_id"),
        max_position_embeddings=raw.get("max_sequence_length"),
    )


@contextlib.contextmanager
def quiet_transformers():
    """Silence transformers' warnings about foreign model types and deprecated fields (Dream and
    LLaDA ship remote-code configs that transformers only half knows; we read their fields ourselves)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)


def read_raw_config(model_dir: str) -> dict:
    """The checkpoint's config.json as a plain dict, parsed by transformers.

    Raises:
        ConfigError: missing directory/file or invalid JSON.
    """
    path = os.path.join(model_dir, "config.json")
    if not os.path.isdir(model_dir):
        raise ConfigError(f"model directory {model_dir!r} does not exist")
    if not os.path.isfile(path):
        raise ConfigError(f"{model_dir!r} has no config.json")
    from transformers import PretrainedConfig

    try:
        with quiet_transformers():
            return PretrainedConfig.from_json_file(path).to_dict()
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from e


def load_config(model_dir: str) -> ModelConfig:
    """Read ``model_dir/config.json`` into a :class:`ModelConfig`.

    Args:
        model_dir: checkpoint directory (Dream or LLaDA layout).

    Raises:
        ConfigError: missing/invalid file, unknown family, missing required field,
            or an architecture option this package does not implement.
    """
    raw = read_raw_config(model_dir)
    path = os.path.join(model_dir, "config.json")
    if raw.get("bos_token_id") is None:  # LLaDA keeps its BOS id in generation_config.json only
        gen_path = os.path.join(model_dir, "generation_config.json")
        if os.path.isfile(gen_path):
            try:
                with open(gen_path, encoding="utf-8") as f:
                    raw["bos_token_id"] = json.load(f).get("bos_token_id")
            except json.JSONDecodeError as e:
                raise ConfigError(f"{gen_path} is not valid JSON: {e}") from e
    family = family_of(raw)
    build = _dream_config if family == "dream" else _llada_config
    try:
        return build(raw, path)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:  # e.g. "hidden_size": "big"
        raise ConfigError(f"{path}: invalid field value ({e})") from e
