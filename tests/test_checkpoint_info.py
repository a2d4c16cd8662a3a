"""``python -m dllm info``: sizes from the safetensors headers against the transformers model the checkpoint
came from, KV bytes against the architecture, prefilling defaults against the checkpoint's file."""

import json
import os

import pytest
import torch

import dllm
from dllm.cli import main
from dllm.cli.info import checkpoint_info, kv_bytes_per_token
from tests.tiny_checkpoints import (
    REFERENCE,
    write_dream_checkpoint,
    write_llada_checkpoint,
    write_real_dream_checkpoint,
)


@pytest.mark.compat
@pytest.mark.parametrize("shards", [1, 3])
def test_info_of_a_dream_checkpoint(tmp_path, shards):
    hf = write_dream_checkpoint(str(tmp_path), shards=shards)
    info = checkpoint_info(str(tmp_path), device="cpu")
    n_params = sum(p.numel() for p in hf.parameters())
    assert info["family"] == "dream" and info["weight_files"] == shards
    assert info["parameters"] == n_params
    assert info["weight_bytes"] == 4 * n_params and info["checkpoint_dtype"] == "float32"
    # DREAM_TINY: 2 layers x 2 KV heads x head_dim 112/14 = 8, K and V, fp32, 1024 tokens
    assert info["runtime_dtype"] == "float32"
    assert info["kv_bytes_per_1k_tokens"] == 2 * 2 * 2 * 8 * 4 * 1024
    assert checkpoint_info(str(tmp_path), dtype="bfloat16")["kv_bytes_per_1k_tokens"] == 2 * 2 * 2 * 8 * 2 * 1024
    assert info["prefilling"]["source"] == "paper defaults"
    assert (info["prefilling"]["chunk_size"], info["prefilling"]["top_k"]) == (1024, 4)
    assert info["prefilling"]["score_terms"] == ["self_info", "pseudo_label"]
    assert (info["anchor_token_id"], info["anchor_source"]) == (128, "config")
    assert info["tokenizer"] is None and info["rope"]["type"] == "default"


def test_info_of_llada_and_real_dream_layouts(tmp_path):
    hf = write_llada_checkpoint(str(tmp_path / "llada"), n_kv_heads=3)
    info = checkpoint_info(str(tmp_path / "llada"), device="cpu")
    assert info["family"] == "llada" and info["parameters"] == sum(p.numel() for p in hf.parameters())
    assert info["kv_bytes_per_1k_tokens"] == 2 * 3 * 3 * 16 * 4 * 1024  # 3 layers, 3 KV heads, 96/6
    assert info["anchor_token_id"] == 93  # generation_config.json
    write_real_dream_checkpoint(str(tmp_path / "real"))
    info = checkpoint_info(str(tmp_path / "real"), device="cpu")
    assert info["architecture"]["vocab_size"] == 152064 and info["model_type"] == "Dream"
    assert (info["anchor_token_id"], info["anchor_source"]) == (151665, "tokenizer")
    assert info["tokenizer"]["chat_template"] is True


def test_kv_bytes_of_the_real_architectures():
    """Dream-v0-7B: 28 layers x 4 KV heads x 128; LLaDA-8B: 32 x 32 x 128 (their config.json), bf16."""
    dream = dllm.load_config(os.path.join(REFERENCE, "dream-v0-7b"))
    llada = dllm.load_config(os.path.join(REFERENCE, "llada-8b"))
    assert 1024 * kv_bytes_per_token(dream, torch.bfloat16) == 2 * 28 * 4 * 128 * 2 * 1024 == 56 * 2**20
    assert 1024 * kv_bytes_per_token(llada, torch.bfloat16) == 2 * 32 * 32 * 128 * 2 * 1024 == 512 * 2**20


@pytest.mark.compat
def test_info_of_the_bundled_model_shows_its_tuned_prefilling_defaults():
    from bench.fidelity.demo import TINY_PREFILLING

    info = checkpoint_info(device="cpu")
    pre = info["prefilling"]
    assert pre["source"] == "prefilling_config.json"
    assert (pre["chunk_size"], pre["top_k"], tuple(pre["score_terms"])) == (
        TINY_PREFILLING.chunk_size,
        TINY_PREFILLING.top_k,
        TINY_PREFILLING.score_terms,
    )
    assert (
        info["parameters"] * 4
        == info["weight_bytes"]
        == os.path.getsize(os.path.join(dllm.default_model_dir(), "model.safetensors"))
        - _header_bytes(os.path.join(dllm.default_model_dir(), "model.safetensors"))
    )


def _header_bytes(path):
    with open(path, "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


def test_cli_info_text_and_json(tmp_path, capsys):
    write_dream_checkpoint(str(tmp_path))
    assert main(["info", "--model", str(tmp_path), "--json", "--device", "cpu"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == checkpoint_info(str(tmp_path), device="cpu")
    assert main(["info", "--model", str(tmp_path), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    n = printed["parameters"]
    assert f"parameters:           {n:,}" in out
    assert f"KV bytes / 1K tokens: {printed['kv_bytes_per_1k_tokens']:,} (256.00 KiB, float32)" in out
    assert "chunk anchor id:      128 (from config)" in out
    assert "prefilling:" in out and "chunk_size=1024" in out and "(from paper defaults)" in out
