"""Tiny random checkpoints with the exact reference config fields and weight names.

Weights come from transformers' own Qwen2 / Llama modules (random init), so the
tests can compare our decoder with theirs on the same numbers. The LLaDA name
map is written out here, from the real LLaDA-8B weight names
(``tests/data/reference/llada-8b/weight_names.txt``), independently of dllm.model.weights.
The reference files are vendored under ``tests/data/reference`` (see its README).
"""

from __future__ import annotations

import copy
import json
import os
import shutil

import torch
from safetensors.torch import save_file

REFERENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "reference")
DREAM_TOKENIZER = os.path.join(REFERENCE, "dream-v0-7b", "tokenizer")

# Odd sizes on purpose; GQA ratio 7 for Dream (14 query heads over 2 KV heads).
DREAM_TINY = dict(
    hidden_size=112,
    intermediate_size=75,
    num_hidden_layers=2,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=131,
    mask_token_id=129,
    bos_token_id=128,
    eos_token_id=127,
    pad_token_id=127,
    rope_theta=10000.0,
)
LLADA_TINY = dict(
    d_model=96,
    mlp_hidden_size=67,
    n_layers=3,
    n_heads=6,
    n_kv_heads=6,
    vocab_size=97,
    embedding_size=97,
    mask_token_id=95,
    eos_token_id=94,
    pad_token_id=94,
    rope_theta=500000.0,
)
LLADA_BOS = 93


def reference_file(*parts: str) -> str:
    """Path of a vendored reference file; skips the calling test (with the reason) when it is absent."""
    path = os.path.join(REFERENCE, *parts)
    if not os.path.exists(path):
        import pytest

        pytest.skip(f"vendored reference file {os.path.relpath(path)} is absent (see tests/data/reference/README.md)")
    return path


def reference_config(family: str) -> dict:
    """The real checkpoint's config.json (Dream-v0-7B or LLaDA-8B) as a dict."""
    with open(reference_file("dream-v0-7b" if family == "dream" else "llada-8b", "config.json")) as f:
        return json.load(f)


def hf_bidirectional_logits(hf, ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Logits ``[B, L, V]`` of a transformers causal-LM class run without a causal mask, on 4.46 and 5.x alike.

    A 4-D additive mask of zeros (every query sees every key) is taken as-is by both versions;
    ``config.is_causal = False`` alone is ignored by 4.46's Qwen2/Llama.
    """
    b, n = ids.shape
    mask = torch.zeros(b, 1, n, n, dtype=next(hf.parameters()).dtype)
    with torch.no_grad():
        return hf(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits


# the transformers config fields the tiny sizes set, and their keys in DREAM_TINY / LLADA_TINY
_HF_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "rope_theta",
)
_SIZE_KEYS = {
    "dream": _HF_FIELDS,
    "llada": ("d_model", "mlp_hidden_size", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "rope_theta"),
}


def _hf_random(family: str, config_cls, model_cls, seed: int, sizes: dict, perturbed, **fixed):
    """The random bidirectional transformers model that hf_dream and hf_llada both build (one recipe, one RNG order)."""
    cfg = config_cls(
        **{hf: sizes[ours] for hf, ours in zip(_HF_FIELDS, _SIZE_KEYS[family])},
        rope_scaling=copy.deepcopy(sizes.get("rope_scaling")),  # transformers 5.x writes into the dict
        tie_word_embeddings=False,
        attn_implementation="eager",
        **fixed,
    )
    cfg.is_causal = False
    torch.manual_seed(seed)
    model = model_cls(cfg).eval()
    with torch.no_grad():  # HF zero-inits biases and sets norms to 1: make them non-trivial
        for n, p in model.named_parameters():
            if perturbed(n):
                p.add_(0.1 * torch.randn_like(p))
    return model


def hf_dream(seed: int = 0, **over):
    """A random transformers Qwen2ForCausalLM sized like DREAM_TINY, bidirectional (eager, is_causal=False).

    ``over`` may also set ``rope_scaling`` and ``max_position_embeddings`` (both go to the config.json
    :func:`write_dream_checkpoint` writes, so transformers and dllm read the same RoPE variant)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    sizes = {**DREAM_TINY, **over}
    return _hf_random(
        "dream",
        Qwen2Config,
        Qwen2ForCausalLM,
        seed,
        sizes,
        lambda n: n.endswith("bias") or "norm" in n,
        max_position_embeddings=sizes.get("max_position_embeddings", 32768),
        rms_norm_eps=1e-6,
    )


def hf_llada(seed: int = 0, **over):
    """A random transformers LlamaForCausalLM sized like LLADA_TINY, bidirectional (``over`` as for
    :func:`hf_dream`, with LLaDA's ``max_sequence_length``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    sizes = {**LLADA_TINY, **over}
    return _hf_random(
        "llada",
        LlamaConfig,
        LlamaForCausalLM,
        seed,
        sizes,
        lambda n: "norm" in n,
        max_position_embeddings=sizes.get("max_sequence_length", 4096),
        rms_norm_eps=1e-5,
        attention_bias=False,
        mlp_bias=False,
    )


def write_dream_checkpoint(out_dir: str, seed: int = 0, shards: int = 1, **over):
    """Write a Dream-layout checkpoint; returns the transformers model it came from."""
    hf = hf_dream(seed, **over)
    cfg = reference_config("dream")
    cfg.update({k: v for k, v in {**DREAM_TINY, **over}.items()})
    cfg["torch_dtype"] = "float32"
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    tensors = {n: p.detach().contiguous() for n, p in hf.state_dict().items()}
    _save(tensors, out_dir, shards)
    return hf


_LLADA_NAMES = {
    "self_attn.q_proj": "q_proj",
    "self_attn.k_proj": "k_proj",
    "self_attn.v_proj": "v_proj",
    "self_attn.o_proj": "attn_out",
    "mlp.gate_proj": "ff_proj",
    "mlp.up_proj": "up_proj",
    "mlp.down_proj": "ff_out",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ff_norm",
}


def llada_name(hf_name: str) -> str:
    if hf_name == "model.embed_tokens.weight":
        return "model.transformer.wte.weight"
    if hf_name == "model.norm.weight":
        return "model.transformer.ln_f.weight"
    if hf_name == "lm_head.weight":
        return "model.transformer.ff_out.weight"
    parts = hf_name.split(".")  # model.layers.N.<module...>.weight
    module = ".".join(parts[3:-1])
    return f"model.transformer.blocks.{parts[2]}.{_LLADA_NAMES[module]}.{parts[-1]}"


def write_llada_checkpoint(out_dir: str, seed: int = 0, shards: int = 1, **over):
    """Write a LLaDA-layout checkpoint; returns the transformers model it came from."""
    hf = hf_llada(seed, **over)
    cfg = reference_config("llada")
    cfg.update({k: v for k, v in {**LLADA_TINY, **over}.items()})
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    # like the real LLaDA-8B, the BOS id lives in generation_config.json only
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": LLADA_BOS, "eos_token_id": LLADA_TINY["eos_token_id"]}, f)
    tensors = {llada_name(n): p.detach().contiguous() for n, p in hf.state_dict().items()}
    _save(tensors, out_dir, shards)
    return hf


def load_tiny(tmp_path_factory, family: str, seed: int, **over):
    """Write a random tiny ``family`` ("dream" or "llada") checkpoint into a fresh temporary folder
    and load it on CPU in fp32 (the model fixtures of the tests)."""
    import dllm  # here, so that writing checkpoints needs no dllm import

    d = str(tmp_path_factory.mktemp(family))
    {"dream": write_dream_checkpoint, "llada": write_llada_checkpoint}[family](d, seed=seed, **over)
    return dllm.load_model(d, device="cpu", dtype=torch.float32)


def small_config(family: str, **fields):
    """A :class:`dllm.ModelConfig` of a small random model built in memory (no checkpoint): 2 layers, hidden 64,
    4 heads over 2 KV heads of D = 16, theta 1e4; Dream's q/k/v bias and shifted logits for "dream"; ``fields``
    give the vocabulary, the MLP width and the special ids, and may override the rest."""
    from dllm.model.config import ModelConfig

    dream = family == "dream"
    base = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0)
    base.update(rms_norm_eps=1e-6, qkv_bias=dream, tie_word_embeddings=False, shift_logits=dream)
    return ModelConfig(family=family, **{**base, **fields})


def small_model(family: str, seed: int = 0, **fields):
    """A random :class:`dllm.model.modeling.DiffusionLM` of :func:`small_config` ``(family, **fields)`` in eval
    mode, its weights drawn after ``torch.manual_seed(seed)``."""
    from dllm.model.modeling import DiffusionLM

    torch.manual_seed(seed)
    return DiffusionLM(small_config(family, **fields)).eval()


def tiny_model_fixtures(dream_seed: int, llada_seed: int, llada_kv_heads: int):
    """The module-scoped ``dream`` and ``llada`` fixtures of a test module (``dream, llada = tiny_model_fixtures(..)``):
    a tiny random checkpoint of each family (:func:`load_tiny`), the LLaDA one with ``llada_kv_heads`` KV heads."""
    import pytest

    @pytest.fixture(scope="module")
    def dream(tmp_path_factory):
        return load_tiny(tmp_path_factory, "dream", seed=dream_seed)

    @pytest.fixture(scope="module")
    def llada(tmp_path_factory):
        return load_tiny(tmp_path_factory, "llada", seed=llada_seed, n_kv_heads=llada_kv_heads)

    return dream, llada


def checkpoint_fixtures(write, seed: int, folder: str, dir_fixture: str):
    """Two module-scoped fixtures of a test module: a checkpoint folder that ``write(folder, seed=seed)`` fills
    (registered under the name ``dir_fixture``) and that checkpoint loaded on CPU in fp32 (``x_dir, x = ...``)."""
    import pytest

    @pytest.fixture(scope="module")
    def checkpoint_dir(tmp_path_factory):
        d = tmp_path_factory.mktemp(folder)
        write(str(d), seed=seed)
        return str(d)

    @pytest.fixture(scope="module")
    def loaded(request):
        import dllm

        return dllm.load_model(request.getfixturevalue(dir_fixture), device="cpu", dtype=torch.float32)

    return checkpoint_dir, loaded


def _save(tensors: dict, out_dir: str, shards: int):
    if shards == 1:
        save_file(tensors, os.path.join(out_dir, "model.safetensors"))
        return
    names = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i::shards]
        save_file({n: tensors[n] for n in part}, os.path.join(out_dir, fname))
        weight_map.update({n: fname for n in part})
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


# The real Dream-v0 vocabulary and special ids (config.json + tokenizer), with a tiny body.
REAL_DREAM_TINY = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rope_theta=1000000.0,
)


def write_real_dream_checkpoint(out_dir: str, seed: int = 0, shards: int = 1):
    """A tiny random checkpoint in the real Dream-v0-Instruct layout: its config.json (``auto_map``, vocab
    152064, mask 151666, bos = eos = pad = 151643) with only the body shrunk, and the real tokenizer files.
    Returns the transformers model it came from."""
    real = reference_config("dream")
    keep = {k: real[k] for k in ("vocab_size", "mask_token_id", "bos_token_id", "eos_token_id", "pad_token_id")}
    hf = write_dream_checkpoint(out_dir, seed=seed, shards=shards, **REAL_DREAM_TINY, **keep)
    tok_dir = os.path.dirname(reference_file("dream-v0-7b", "tokenizer", "tokenizer_config.json"))
    for name in sorted(os.listdir(tok_dir)):
        shutil.copyfile(os.path.join(tok_dir, name), os.path.join(out_dir, name))
    for name in ("generation_config.json",):
        shutil.copyfile(reference_file("dream-v0-7b", name), os.path.join(out_dir, name))
    return hf


def snapped_starts(text: str, size: int, tol: int) -> list[int]:
    """Chunk starts cut from the text itself: each boundary moved back to just after the last '.', '!', '?'
    or newline within ``tol`` characters of the fixed cut (the bundled tokenizer is one token per character)."""
    starts, s = [], 0
    while s < len(text):
        starts.append(s)
        b = s + size
        if b >= len(text):
            break
        ends = [e for e in range(b - tol, b + 1) if e > s and text[e - 1] in ".!?\n"]
        s = max(ends) if ends else b
    return starts
