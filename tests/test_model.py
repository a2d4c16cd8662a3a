"""Model equality: our decoder vs transformers' Qwen2 / Llama modules run bidirectionally."""

import json
import os

import pytest
import torch

import dllm
from dllm.model.config import ConfigError
from dllm.model.weights import WeightError
from tests.tiny_checkpoints import (
    DREAM_TOKENIZER,
    REFERENCE,
    hf_bidirectional_logits,
    write_dream_checkpoint,
    write_llada_checkpoint,
)


def _ids(vocab, b=2, n=23, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab - 3, (b, n), generator=g)


@pytest.mark.compat
@pytest.mark.parametrize("shards", [1, 3])
def test_dream_logits_equal_transformers_qwen2(tmp_path, shards):
    hf = write_dream_checkpoint(str(tmp_path), shards=shards)
    model = dllm.load_model(str(tmp_path), device="cpu", dtype=torch.float32)
    assert model.family == "dream" and model.shift_logits and model.mask_token_id == 129
    ids = _ids(model.config.vocab_size)
    pos = torch.arange(ids.shape[1])
    ref = hf_bidirectional_logits(hf, ids)
    with torch.no_grad():
        ours = model(ids, pos).logits
    # Dream shifts: token i is predicted at position i-1, token 0 at itself.
    ref_shifted = torch.cat([ref[:, :1], ref[:, :-1]], dim=1)
    assert (ours - ref_shifted).abs().max().item() <= 1e-4


@pytest.mark.compat
def test_transformers_reference_is_bidirectional(tmp_path):
    """Guard: the reference we compare with must not be causal (else equality would mean nothing)."""
    hf = write_dream_checkpoint(str(tmp_path))
    ids = _ids(131, b=1, n=9)
    full = hf_bidirectional_logits(hf, ids)
    prefix = hf_bidirectional_logits(hf, ids[:, :5])
    # Under a causal mask the first 5 positions would not depend on later tokens.
    assert (full[:, :5] - prefix).abs().max().item() > 1e-3


@pytest.mark.compat
@pytest.mark.parametrize("shards", [1, 2])
def test_llada_logits_equal_transformers_llama(tmp_path, shards):
    hf = write_llada_checkpoint(str(tmp_path), shards=shards)
    model = dllm.load_model(str(tmp_path), device="cpu", dtype="float32")
    assert model.family == "llada" and not model.shift_logits and model.mask_token_id == 95
    ids = _ids(model.config.vocab_size, n=31)
    ref = hf_bidirectional_logits(hf, ids)
    with torch.no_grad():
        ours = model(ids, torch.arange(31)).logits
    assert (ours - ref).abs().max().item() <= 1e-4


@pytest.mark.compat
def test_llada_gqa_and_explicit_positions(tmp_path):
    """Non-contiguous explicit positions go through RoPE exactly as transformers does."""
    hf = write_llada_checkpoint(str(tmp_path), n_kv_heads=2)
    model = dllm.load_model(str(tmp_path), device="cpu", dtype=torch.float32)
    ids = _ids(97, b=1, n=12)
    pos = torch.tensor([[0, 1, 2, 3, 40, 41, 42, 43, 1000, 1001, 1002, 5000]])
    ref = hf_bidirectional_logits(hf, ids, pos)
    with torch.no_grad():
        ours = model(ids, pos).logits
    assert (ours - ref).abs().max().item() <= 1e-4


@pytest.mark.compat
def test_checkpoint_names_match_reference(tmp_path):
    """The tiny checkpoints use exactly the reference weight-name patterns (layer 0 + top level)."""
    from safetensors import safe_open

    for family, writer, ref in [
        ("dream", write_dream_checkpoint, "dream-v0-7b"),
        ("llada", write_llada_checkpoint, "llada-8b"),
    ]:
        d = tmp_path / family
        writer(str(d))
        with safe_open(str(d / "model.safetensors"), "pt") as f:
            ours = {
                n
                for n in f.keys()
                if ".layers.0." in n or ".blocks.0." in n or not any(s in n for s in (".layers.", ".blocks."))
            }
        with open(os.path.join(REFERENCE, ref, "weight_names.txt")) as f:
            names = {n.strip() for n in f if n.strip()}
        expect = {
            n
            for n in names
            if ".layers.0." in n or ".blocks.0." in n or not any(s in n for s in (".layers.", ".blocks."))
        }
        assert ours == expect, family


def test_bf16_forward_close_to_fp32(tmp_path):
    write_dream_checkpoint(str(tmp_path))
    m32 = dllm.load_model(str(tmp_path), device="cpu", dtype=torch.float32)
    m16 = dllm.load_model(str(tmp_path), device="cpu", dtype=torch.bfloat16)
    ids = _ids(131, b=1, n=16)
    with torch.no_grad():
        a = m32(ids, torch.arange(16)).logits
        b = m16(ids, torch.arange(16)).logits
    assert b.dtype == torch.bfloat16
    assert torch.isfinite(b.float()).all()
    assert (a - b.float()).abs().max().item() < 0.1 * a.abs().max().item()


# --- bad input -------------------------------------------------------------------


@pytest.mark.compat
def test_missing_config(tmp_path):
    with pytest.raises(ConfigError, match="no config.json"):
        dllm.load_model(str(tmp_path))
    with pytest.raises(ConfigError, match="does not exist"):
        dllm.load_model(str(tmp_path / "nope"))


@pytest.mark.compat
def test_invalid_config_json(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        dllm.load_model(str(tmp_path))


def _dream_config(tmp_path) -> dict:
    """A tiny Dream checkpoint written into ``tmp_path``; its config.json as a dict."""
    write_dream_checkpoint(str(tmp_path))
    return json.loads((tmp_path / "config.json").read_text())


def _load_with(tmp_path, cfg: dict):
    """The checkpoint in ``tmp_path`` loaded with ``cfg`` as its config.json."""
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return dllm.load_model(str(tmp_path))


@pytest.mark.compat
def test_unknown_family(tmp_path):
    cfg = _dream_config(tmp_path)
    cfg["model_type"], cfg["architectures"] = "gpt2", ["GPT2LMHeadModel"]
    with pytest.raises(ConfigError, match="unknown model family"):
        _load_with(tmp_path, cfg)


@pytest.mark.compat
def test_missing_field_and_bad_gqa(tmp_path):
    cfg = _dream_config(tmp_path)
    bad = dict(cfg)
    del bad["mask_token_id"]
    with pytest.raises(ConfigError, match="mask_token_id"):
        _load_with(tmp_path, bad)
    with pytest.raises(ConfigError, match="multiple of num_kv_heads"):
        _load_with(tmp_path, dict(cfg, num_key_value_heads=3))


@pytest.mark.compat
def test_weight_shape_mismatch(tmp_path):
    cfg = _dream_config(tmp_path)
    with pytest.raises(WeightError, match="shape mismatch"):
        _load_with(tmp_path, dict(cfg, intermediate_size=76))


@pytest.mark.compat
def test_missing_weights_and_foreign_names(tmp_path):
    from safetensors.torch import load_file, save_file

    write_dream_checkpoint(str(tmp_path))
    path = str(tmp_path / "model.safetensors")
    t = load_file(path)
    del t["model.norm.weight"]
    save_file(t, path)
    with pytest.raises(WeightError, match="lacks 1 tensor"):
        dllm.load_model(str(tmp_path))
    t["model.transformer.wte.weight"] = torch.zeros(1)
    save_file(t, path)
    with pytest.raises(WeightError, match="unknown parameter 'transformer.wte.weight'"):
        dllm.load_model(str(tmp_path))
    os.remove(path)
    with pytest.raises(WeightError, match="no model.safetensors"):
        dllm.load_model(str(tmp_path))


def test_bad_dtype(tmp_path):
    write_dream_checkpoint(str(tmp_path))
    with pytest.raises(ValueError, match="unsupported dtype"):
        dllm.load_model(str(tmp_path), dtype=torch.int8)


@pytest.mark.compat
def test_dream_tokenizer_ids():
    tok = dllm.load_tokenizer(DREAM_TOKENIZER)
    assert tok.convert_tokens_to_ids("<|mask|>") == 151666
    assert tok.bos_token_id == 151665
    assert tok.mask_token_id == 151666
