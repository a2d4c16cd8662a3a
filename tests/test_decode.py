"""Decode loops on tiny random checkpoints: prefix_cache with per-step rebuilds equals dense."""

import pytest
import torch

import dllm
from tests.tiny_checkpoints import tiny_model_fixtures

dream, llada = tiny_model_fixtures(dream_seed=3, llada_seed=4, llada_kv_heads=2)


def _prompt(model, n=19, b=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size - 5, (b, n), generator=g)


@pytest.mark.parametrize("family", ["dream", "llada"])
@pytest.mark.parametrize("alg", ["maskgit_plus", "topk_margin", "entropy", "low_confidence", "confidence_threshold"])
def test_prefix_cache_rebuilt_every_step_equals_dense(family, alg, dream, llada):
    model = dream if family == "dream" else llada
    p = _prompt(model, b=2)
    kw = dict(gen_length=12, steps=12, block_length=4, alg=alg, threshold=0.02, block_cache="off")  # the exact paths
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
    with pytest.raises(ValueError, match="seg_slots out of range: .* a slot in \\[0, P=2\\)"):
        dllm.StaticKVCache(k, k, torch.tensor([[2]], dtype=torch.int32), torch.tensor([[1]], dtype=torch.int32))
    with pytest.raises(ValueError, match="seg_lens out of range: every entry must be in \\[0, T=5\\]"):
        dllm.StaticKVCache(k, k, torch.tensor([[1]], dtype=torch.int32), torch.tensor([[6]], dtype=torch.int32))


def test_phase_timer_sums_repeats_and_nests():
    import time

    from dllm.decode.timer import PhaseTimer

    timer = PhaseTimer("cpu")
    with timer.phase("total"):
        for _ in range(2):
            with timer.phase("decode"):
                time.sleep(0.02)
    s = timer.seconds
    assert set(s) == {"total", "decode"}
    assert 0.04 <= s["decode"] <= s["total"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_phase_timer_on_cuda_reads_events_once():
    from dllm.decode.timer import PhaseTimer

    timer = PhaseTimer("cuda")
    x = torch.randn(2048, 2048, device="cuda")
    with timer.phase("matmul"):
        for _ in range(20):
            x = x @ x / 2048
    assert timer._pending  # nothing was read yet: no synchronisation inside the phase
    assert timer.seconds["matmul"] > 0 and not timer._pending


@pytest.mark.parametrize("method", ["dense", "prefix_cache"])
def test_live_block_is_one_buffer_and_equals_a_fresh_forward(dream, method):
    """Every step writes the response into the same live buffer at fixed positions; the logits are
    those of a forward over freshly concatenated ids (dense) / the Fast-dLLM prefix cache."""
    from dllm.decode.policies import DensePolicy, PrefixCachePolicy
    from dllm.decode.timer import PhaseTimer

    p = _prompt(dream, n=11)
    if method == "dense":
        policy = DensePolicy(dream, p, 6)
    else:
        policy = PrefixCachePolicy(dream, p, 6, PhaseTimer("cpu"), live_window=3, refresh="step")
    ptr, pos = policy.live.ids.data_ptr(), policy.live.positions.clone()
    g = torch.Generator().manual_seed(1)
    for step in range(3):
        resp = torch.randint(0, 120, (1, 6), generator=g)
        resp[0, step::2] = dream.mask_token_id
        policy.prepare(resp, slice(0, 6), step)
        got = policy.logits(resp)
        assert policy.live.ids.data_ptr() == ptr and torch.equal(policy.live.positions, pos)
        with torch.no_grad():
            want = dream(torch.cat([p, resp], 1), torch.arange(17), logits_start=11).logits
        tol = 0.0 if method == "dense" else 1e-5
        assert (got - want).abs().max().item() <= tol
    assert policy.nfe == (3 if method == "dense" else 6)


def test_decode_phase_times_the_steps_and_dense_builds_no_cache(dream):
    res = dllm.generate(dream, _prompt(dream), gen_length=4, steps=4)
    assert set(res.stats.seconds) == {"total", "decode"}
    assert 0 < res.stats.seconds["decode"] <= res.stats.seconds["total"]


def _segment(t, length, seed, layers=2, hkv=2, d=8):
    from dllm.model.kv_cache import Segment

    g = torch.Generator().manual_seed(seed)
    return Segment(
        [torch.randn(t, hkv, d, generator=g) for _ in range(layers)],
        [torch.randn(t, hkv, d, generator=g) for _ in range(layers)],
        length,
    )


def test_from_rows_packs_ragged_rows_into_one_segment_table():
    rows = [[_segment(5, 5, 0), _segment(7, 3, 1)], [_segment(4, 4, 2)]]
    cache = dllm.StaticKVCache.from_rows(rows)
    assert cache.seg_slots.tolist() == [[0, 1], [2, -1]]
    assert cache.seg_lens.tolist() == [[5, 3], [4, 0]]
    assert cache.k[0].shape == (3, 5, 2, 8)  # P = 3 segments, T = longest valid length
    assert cache.tokens_per_row().tolist() == [8, 4]
    for layer in range(2):
        for slot, seg in enumerate(s for row in rows for s in row):
            assert torch.equal(cache.k[layer][slot, : seg.length], seg.k[layer][: seg.length])
            assert torch.equal(cache.v[layer][slot, : seg.length], seg.v[layer][: seg.length])
            assert not cache.k[layer][slot, seg.length :].any()  # zero padding
    with pytest.raises(ValueError, match="at least one segment"):
        dllm.StaticKVCache.from_rows([[]])
    with pytest.raises(ValueError, match="segment length 6 outside"):
        _segment(5, 6, 0)


def test_a_two_row_cache_decodes_each_row_as_alone(dream):
    """Batch readiness: rows with their own segments in one table give each row's own logits."""
    from dllm.model.kv_cache import Segment

    segs = []
    for seed, n in ((0, 9), (1, 5)):
        with torch.no_grad():
            out = dream(_prompt(dream, n=n, seed=seed), torch.arange(n), logits_start=n, return_kv=True)
        segs.append(Segment([k[0] for k in out.k], [v[0] for v in out.v], n))
    live = _prompt(dream, n=4, b=2, seed=7)
    with torch.no_grad():
        both = dream(live, torch.arange(9, 13), dllm.StaticKVCache.from_rows([[segs[0]], [segs[1]]]))
        for row in range(2):
            alone = dream(live[row : row + 1], torch.arange(9, 13), dllm.StaticKVCache.from_rows([[segs[row]]]))
            assert (both.logits[row] - alone.logits[0]).abs().max().item() < 1e-5


class _ScriptedPolicy:
    """Logits drawn from a generator seeded by the call index; column 0 favours the mask token at some
    steps (a rule that let the model pick the mask id would write it back); ``no_mask``: the mask
    token's logit is -inf everywhere (the reference then runs main's exact code)."""

    def __init__(self, batch, gen_length, vocab, mask_id, seed, no_mask=False):
        self.batch_size, self.nfe = batch, 0
        self.shape, self.mask_id, self.seed, self.no_mask = (batch, gen_length, vocab), mask_id, seed, no_mask

    def prepare(self, resp, block, step):
        pass

    def logits(self, resp):
        g = torch.Generator().manual_seed(self.seed * 1000 + self.nfe)
        out = torch.randn(self.shape, generator=g) * 3
        if self.nfe % 3 == 1:
            out[:, 0, self.mask_id] = 50.0
        if self.no_mask:
            out[..., self.mask_id] = float("-inf")
        self.nfe += 1
        return out


GREEDY = ["maskgit_plus", "topk_margin", "entropy", "low_confidence", "confidence_threshold"]


@pytest.mark.parametrize("alg", GREEDY)
@pytest.mark.parametrize("steps", [2, 4, 8])
@pytest.mark.parametrize("no_mask", [False, True])
def test_batched_step_equals_the_per_row_loop(alg, steps, no_mask):
    """The batched step (one [B, block] decision per step) gives the tokens, step count and per-row steps
    of main's per-row loop (``tests/unmasking_reference.py``: gather candidates, rank, pick, boolean
    write-back, a mask check every step); with the mask token's logit at -inf that is main's exact code."""
    from dllm.decode.denoise import denoise
    from dllm.decode.unmasking import UnmaskingConfig
    from tests.unmasking_reference import reference_denoise

    cfg = UnmaskingConfig(alg=alg, threshold=0.3)
    mask_id = 7
    for seed in range(3):
        resp_a = torch.full((3, 8), mask_id)
        resp_b = resp_a.clone()
        want = reference_denoise(_ScriptedPolicy(3, 8, 11, mask_id, seed, no_mask), resp_a, mask_id, 4, steps, cfg)
        row_steps = []
        n = denoise(
            _ScriptedPolicy(3, 8, 11, mask_id, seed, no_mask),
            resp_b,
            mask_id=mask_id,
            block_length=4,
            steps_per_block=steps,
            cfg=cfg,
            row_steps=row_steps,
        )
        assert torch.equal(resp_a, resp_b) and (n, row_steps) == want
        assert (resp_b != mask_id).all()


def test_denoise_needs_a_masked_response():
    from dllm.decode.denoise import denoise
    from dllm.decode.unmasking import UnmaskingConfig

    resp = torch.full((1, 4), 7)
    resp[0, 1] = 2
    with pytest.raises(ValueError, match="mask tokens only"):
        denoise(
            _ScriptedPolicy(1, 4, 11, 7, 0), resp, mask_id=7, block_length=4, steps_per_block=4, cfg=UnmaskingConfig()
        )
