"""Decode loops on tiny random checkpoints: prefix_cache with per-step rebuilds equals dense."""

import pytest
import torch

import dllm
from tests.tiny_checkpoints import write_dream_checkpoint, write_llada_checkpoint


@pytest.fixture(scope="module")
def dream(tmp_path_factory):
    d = tmp_path_factory.mktemp("dream")
    write_dream_checkpoint(str(d), seed=3)
    return dllm.load_model(str(d), device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def llada(tmp_path_factory):
    d = tmp_path_factory.mktemp("llada")
    write_llada_checkpoint(str(d), seed=4, n_kv_heads=2)
    return dllm.load_model(str(d), device="cpu", dtype=torch.float32)


def _prompt(model, n=19, b=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size - 5, (b, n), generator=g)


@pytest.mark.parametrize("family", ["dream", "llada"])
@pytest.mark.parametrize("alg", ["maskgit_plus", "topk_margin", "entropy", "low_confidence", "confidence_threshold"])
def test_prefix_cache_rebuilt_every_step_equals_dense(family, alg, dream, llada):
    model = dream if family == "dream" else llada
    p = _prompt(model, b=2)
    kw = dict(gen_length=12, steps=12, block_length=4, alg=alg, threshold=0.02)
    dense = dllm.generate(model, p, method="dense", **kw)
    cached = dllm.generate(model, p, method="prefix_cache", cache_refresh="step", **kw)
    assert torch.equal(dense.tokens, cached.tokens)
    assert (dense.tokens != model.mask_token_id).all()


@pytest.mark.parametrize("live_window", [1, 5])
def test_cached_logits_equal_dense_logits(dream, live_window):
    """The cached path (split-S attention over the prompt cache) reproduces dense logits."""
    p = _prompt(dream, n=17)
    resp = torch.randint(0, 120, (1, 8))
    resp[0, ::2] = dream.mask_token_id
    x = torch.cat([p, resp], 1)
    with torch.no_grad():
        full = dream(x, torch.arange(25), logits_start=17, return_kv=True)
        cache = dllm.StaticKVCache.single_segment(
            [k[:, : 17 - live_window] for k in full.k], [v[:, : 17 - live_window] for v in full.v]
        )
        live = dream(x[:, 17 - live_window :], torch.arange(17 - live_window, 25), cache, logits_start=live_window)
    assert (live.logits - full.logits).abs().max().item() < 1e-5


def test_prefix_cache_default_runs_and_counts_nfe(llada):
    p = _prompt(llada)
    res = dllm.generate(llada, p, method="prefix_cache", gen_length=8, steps=8, block_length=4)
    # one cache build per block + one live forward per step
    assert res.stats.nfe == 2 + 8
    assert res.stats.seconds["prefill"] > 0 and res.stats.seconds["decode"] > 0
    assert (res.tokens != llada.mask_token_id).all()


def test_dense_nfe_and_determinism(dream):
    p = _prompt(dream)
    a = dllm.generate(dream, p, gen_length=8, steps=4)
    b = dllm.generate(dream, p, gen_length=8, steps=4)
    assert a.stats.nfe == 4 and torch.equal(a.tokens, b.tokens)
    s1 = dllm.generate(dream, p, gen_length=8, steps=4, temperature=1.0, seed=5)
    s2 = dllm.generate(dream, p, gen_length=8, steps=4, temperature=1.0, seed=5)
    assert torch.equal(s1.tokens, s2.tokens)


def test_prompt_on_wrong_device(dream):
    with pytest.raises(ValueError, match="on meta but the model is on cpu"):
        dllm.generate(dream, torch.zeros(1, 4, dtype=torch.long, device="meta"))


def test_prefix_cache_bad_options(dream):
    p = _prompt(dream, n=5)
    with pytest.raises(ValueError, match="live_window"):
        dllm.generate(dream, p, method="prefix_cache", live_window=6, gen_length=4)
    with pytest.raises(ValueError, match="refresh"):
        dllm.generate(dream, p, method="prefix_cache", cache_refresh="never", gen_length=4)


def test_static_cache_validates_its_segment_table():
    k = [torch.zeros(2, 5, 1, 4)]
    with pytest.raises(ValueError, match="pool slot in \\[0, 2\\)"):
        dllm.StaticKVCache(k, k, torch.tensor([[2]], dtype=torch.int32), torch.tensor([[1]], dtype=torch.int32))
    with pytest.raises(ValueError, match="seg_lens must be in \\[0, T=5\\]"):
        dllm.StaticKVCache(k, k, torch.tensor([[1]], dtype=torch.int32), torch.tensor([[6]], dtype=torch.int32))
