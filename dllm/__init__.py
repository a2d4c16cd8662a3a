"""dllm: a small runtime for diffusion LMs (Dream, LLaDA) with Prefilling-dLLM long-context inference.

Public entry points: :func:`load_model`, :func:`generate`, :func:`encode_document`.
"""

from dllm.generate import GenerationResult, GenerationStats, generate
from dllm.model.config import ConfigError, ModelConfig, load_config
from dllm.model.kv_cache import Segment, StaticKVCache
from dllm.model.loader import default_model_dir, load_model, load_tokenizer
from dllm.model.modeling import DiffusionLM
from dllm.model.tokenization import decode_text, encode_text
from dllm.model.weights import WeightError
from dllm.prefilling import DocumentCache, PrefillingConfig, PromptParts, encode_document

__all__ = [
    "ConfigError",
    "DiffusionLM",
    "DocumentCache",
    "GenerationResult",
    "GenerationStats",
    "ModelConfig",
    "PrefillingConfig",
    "PromptParts",
    "Segment",
    "StaticKVCache",
    "WeightError",
    "decode_text",
    "default_model_dir",
    "encode_document",
    "encode_text",
    "generate",
    "load_config",
    "load_model",
    "load_tokenizer",
]
