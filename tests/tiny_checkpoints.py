"""Tiny random checkpoints with the exact reference config fields and weight names.

Weights come from transformers' own Qwen2 / Llama modules (random init), so the
tests can compare our decoder with theirs on the same numbers. The LLaDA name
map is written out here, from shared/reference/llada-8b/weight_names.txt,
independently of dllm.weights.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file

SHARED = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "shared"))
REFERENCE = os.path.join(SHARED, "reference")

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


def reference_config(family: str) -> dict:
    with open(os.path.join(REFERENCE, "dream-v0-7b" if family == "dream" else "llada-8b", "config.json")) as f:
        return json.load(f)


def hf_dream(seed: int = 0, **over):
    """A random transformers Qwen2ForCausalLM sized like DREAM_TINY, bidirectional (eager, is_causal=False)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    sizes = {**DREAM_TINY, **over}
    cfg = Qwen2Config(
        hidden_size=sizes["hidden_size"],
        intermediate_size=sizes["intermediate_size"],
        num_hidden_layers=sizes["num_hidden_layers"],
        num_attention_heads=sizes["num_attention_heads"],
        num_key_value_heads=sizes["num_key_value_heads"],
        vocab_size=sizes["vocab_size"],
        rope_theta=sizes["rope_theta"],
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    cfg.is_causal = False
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # HF zero-inits biases and sets norms to 1: make them non-trivial
        for n, p in model.named_parameters():
            if n.endswith("bias") or "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
    return model


def hf_llada(seed: int = 0, **over):
    """A random transformers LlamaForCausalLM sized like LLADA_TINY, bidirectional."""
    from transformers import LlamaConfig, LlamaForCausalLM

    sizes = {**LLADA_TINY, **over}
    cfg = LlamaConfig(
        hidden_size=sizes["d_model"],
        intermediate_size=sizes["mlp_hidden_size"],
        num_hidden_layers=sizes["n_layers"],
        num_attention_heads=sizes["n_heads"],
        num_key_value_heads=sizes["n_kv_heads"],
        vocab_size=sizes["vocab_size"],
        rope_theta=sizes["rope_theta"],
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        attn_implementation="eager",
    )
    cfg.is_causal = False
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
    return model


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
