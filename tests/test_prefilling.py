"""Prefilling-dLLM pipeline on tiny random checkpoints: exactness against prefix_cache, positions, errors."""

import pytest
import torch

import dllm
from dllm.decode.policies import PrefixCachePolicy
from dllm.decode.timer import PhaseTimer
from dllm.model.rope import rotate_keys
from dllm.prefilling import PrefillingConfig, PromptParts, build_prefilling_policy, chunk_offsets
from tests.tiny_checkpoints import LLADA_BOS, tiny_model_fixtures

BOS = 128  # DREAM_TINY bos_token_id


dream, llada = tiny_model_fixtures(dream_seed=11, llada_seed=12, llada_kv_heads=3)


def _parts(n_prefix=6, n_ctx=37, n_query=6, seed=0, bos=BOS, vocab=120):
    g = torch.Generator().manual_seed(seed)
    r = lambda n: torch.randint(0, vocab, (n,), generator=g)
    prefix = torch.cat([torch.tensor([bos]), r(n_prefix - 1)]) if n_prefix else torch.zeros(0, dtype=torch.long)
    return PromptParts(prefix, r(n_ctx), r(n_query))


def _policy_logits(policy, resp):
    policy.prepare(resp, slice(0, resp.shape[1]), 0)
    return policy.logits(resp)


def test_llada_bos_read_from_generation_config(llada):
    assert llada.config.bos_token_id == LLADA_BOS


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_joint_absolute_all_chunks_equals_prefix_cache(family, dream, llada):
    """K = N, B = None, absolute positions, joint mode == prefix_cache with the query live."""
    model = dream if family == "dream" else llada
    bos = BOS if family == "dream" else LLADA_BOS
    parts = _parts(bos=bos, vocab=90)
    cfg = PrefillingConfig(chunk_size=8, top_k=None, position_mode="absolute", cache_mode="joint")
    nq = parts.query.numel()
    kw = dict(gen_length=8, steps=8)
    a = dllm.generate(model, method="prefilling", prompt=parts, prefilling=cfg, **kw)
    b = dllm.generate(model, parts.full()[None], method="prefix_cache", live_window=nq, **kw)
    assert torch.equal(a.tokens, b.tokens)
    # logits to fp32 round-off, on the initial all-mask response and on a half-filled one
    resp = torch.full((1, 8), model.mask_token_id)
    pol_a = build_prefilling_policy(model, None, parts, cfg, PhaseTimer("cpu"), gen_length=8).policy
    pol_b = PrefixCachePolicy(model, parts.full()[None], 8, PhaseTimer("cpu"), live_window=nq)
    pol_b.prepare(resp, slice(0, 8), 0)
    for r in (resp, torch.where(torch.arange(8) % 2 == 0, resp, torch.arange(8) + 3)):
        la, lb = pol_a.logits(r), pol_b.logits(r)
        assert (la - lb).abs().max().item() < 1e-4


@pytest.mark.parametrize("mode", ["continuous", "absolute", "reuse"])
def test_one_chunk_independent_equals_prefix_cache_on_bos_chunk(dream, mode):
    """One chunk holding the whole context == prefix_cache on the prompt BOS + chunk (+ live query)."""
    parts = _parts(n_prefix=0, n_ctx=20, n_query=5)
    cfg = PrefillingConfig(chunk_size=64, top_k=1, position_mode=mode)
    prompt = torch.cat([torch.tensor([BOS]), parts.context, parts.query])[None]
    kw = dict(gen_length=6, steps=6)
    a = dllm.generate(dream, method="prefilling", prompt=parts, prefilling=cfg, **kw)
    b = dllm.generate(dream, prompt, method="prefix_cache", live_window=5, cache_scope="prompt", **kw)
    # (absolute puts the BOS anchor at -1 and the chunk at 0..19: a uniform shift, same logits under RoPE)
    assert torch.equal(a.tokens, b.tokens)
    resp = torch.full((1, 6), dream.mask_token_id)
    pol_a = build_prefilling_policy(dream, None, parts, cfg, PhaseTimer("cpu"), gen_length=6).policy
    pol_b = PrefixCachePolicy(dream, prompt, 6, PhaseTimer("cpu"), live_window=5, scope="prompt")
    assert (_policy_logits(pol_a, resp) - _policy_logits(pol_b, resp)).abs().max().item() < 1e-4


def test_rotating_cached_keys_equals_encoding_at_shifted_positions(dream):
    ids = torch.randint(0, 120, (1, 13))
    for delta in (1, 37, 4096, 31999):
        with torch.no_grad():
            local = dream(ids, torch.arange(13), return_kv=True, logits_start=13)
            moved = dream(ids, torch.arange(delta, delta + 13), return_kv=True, logits_start=13)
        for k0, k1, v0, v1 in zip(local.k, moved.k, local.v, moved.v):
            assert (rotate_keys(k0, delta, dream.config.rope_theta) - k1).abs().max().item() < 2e-5
            assert (v0 - v1).abs().max().item() < 2e-5  # values do not depend on position


def test_chunk_offsets_by_hand():
    sizes = [8, 8, 8, 8, 5]  # 37 context tokens, C = 8
    # continuous: kept 1 and 3 back to back after a 6-token prefix, each with its BOS (9 tokens)
    assert chunk_offsets("continuous", 6, [1, 3], sizes, 8) == ([6, 15], 24)
    # reuse: both at 6, query after the longest (8 + BOS)
    assert chunk_offsets("reuse", 6, [1, 4], sizes, 8) == ([6, 6], 15)
    # absolute: token i of chunk j at 6 + 8j + i, BOS one before; query at 6 + 37
    assert chunk_offsets("absolute", 6, [1, 4], sizes, 8) == ([13, 37], 43)
    assert chunk_offsets("absolute", 6, [0, 4], sizes, 8, anchors=False) == ([6, 38], 43)


def test_selection_and_token_budget(dream):
    parts = _parts(n_ctx=61)
    cfg = PrefillingConfig(chunk_size=8, top_k=3, token_budget=4, pool_kernel=3)
    res = dllm.generate(dream, method="prefilling", prompt=parts, prefilling=cfg, gen_length=6, steps=3)
    ex = res.stats.extra
    assert ex["num_chunks"] == 8 and len(ex["selected_chunks"]) == 3
    assert ex["selected_chunks"] == sorted(ex["selected_chunks"])
    # the kept chunks are the top-3 scores
    top = sorted(range(8), key=lambda j: -ex["all_chunk_scores"][j])[:3]
    assert sorted(top) == ex["selected_chunks"]
    # cache: prefix (6) + 3 chunks x (B=4 + BOS)
    assert ex["cached_tokens"] == 6 + 3 * 5
    assert (res.tokens != dream.mask_token_id).all()
    # NFE: 1 chunk batch + 1 prefix + 1 draft + 2 scoring passes + 3 steps
    assert res.stats.nfe == 1 + 1 + 1 + 2 + 3
    for phase in ("prefill", "scoring", "decode", "total"):
        assert res.stats.seconds[phase] > 0


@pytest.mark.parametrize(
    "terms",
    [("self_info", "answer_confidence"), ("pseudo_label",), ("answer_confidence",), ("self_info", "draft_contrast")],
)
def test_score_terms_sum_into_the_chunk_score(dream, terms):
    parts = _parts(n_ctx=50)
    cfg = PrefillingConfig(chunk_size=8, top_k=3, score_terms=terms)
    ex = dllm.generate(dream, method="prefilling", prompt=parts, prefilling=cfg, gen_length=4, steps=2).stats.extra
    term = {
        "self_info": lambda i: ex["s_I"][i],
        "pseudo_label": lambda i: ex["s_P"][i],
        "answer_confidence": lambda i: ex["s_C"][i],
        "draft_contrast": lambda i: ex["s_C"][i] - ex["s_P"][i],
    }
    for i in range(3):
        want = sum(term[t](i) for t in terms)
        assert abs(ex["chunk_scores"][i] - want) < 1e-3
    assert all(s <= 0 for s in ex["s_C"])  # log-probabilities


def _unmasks_all(model, parts, cfg, **kw) -> bool:
    """A prefilling run of ``parts`` ends with no mask token left (what the rule tests below check)."""
    res = dllm.generate(model, method="prefilling", prompt=parts, prefilling=cfg, **kw)
    return bool((res.tokens != model.mask_token_id).all())


@pytest.mark.parametrize("alg", ["maskgit_plus", "topk_margin", "entropy", "origin", "confidence_threshold"])
def test_all_unmasking_rules_run_with_prefilling(dream, alg):
    cfg = PrefillingConfig(chunk_size=8, top_k=2)
    assert _unmasks_all(dream, _parts(n_ctx=30), cfg, alg=alg, seed=0, gen_length=4, steps=4)


def test_llada_rules_and_blocks_with_prefilling(llada):
    parts = _parts(bos=LLADA_BOS, vocab=90, n_ctx=30)
    cfg = PrefillingConfig(chunk_size=8, top_k=2, token_budget=3)
    for alg in ("low_confidence", "random"):
        assert _unmasks_all(llada, parts, cfg, alg=alg, seed=1, gen_length=8, steps=4, block_length=4)


def test_joint_mode_with_token_budget(dream):
    parts = _parts(n_ctx=40)
    cfg = PrefillingConfig(chunk_size=8, top_k=2, token_budget=3, cache_mode="joint")
    res = dllm.generate(dream, method="prefilling", prompt=parts, prefilling=cfg, gen_length=4, steps=2)
    assert res.stats.extra["cached_tokens"] == 6 + 2 * 3  # joint chunks carry no BOS anchor


def test_causal_score_mode(dream, llada):
    parts = _parts(n_ctx=30)
    cfg = PrefillingConfig(chunk_size=8, top_k=2, score_mode="causal")
    res = dllm.generate(dream, method="prefilling", prompt=parts, prefilling=cfg, gen_length=4, steps=2)
    assert len(res.stats.extra["selected_chunks"]) == 2
    with pytest.raises(ValueError, match="shifted"):
        dllm.generate(llada, method="prefilling", prompt=_parts(bos=LLADA_BOS, vocab=90), prefilling=cfg, gen_length=4)


def test_context_shorter_than_one_chunk_is_one_chunk(dream):
    parts = _parts(n_ctx=5)
    res = dllm.generate(
        dream, method="prefilling", prompt=parts, gen_length=4, prefilling=PrefillingConfig(chunk_size=1024, top_k=1)
    )
    assert res.stats.extra["num_chunks"] == 1 and res.stats.extra["selected_chunks"] == [0]


def test_whole_prompt_fallback_split(dream):
    ids = torch.cat([torch.tensor([BOS]), torch.randint(0, 120, (100,))])
    res = dllm.generate(
        dream,
        ids[None],
        method="prefilling",
        gen_length=4,
        prefilling=PrefillingConfig(chunk_size=16, top_k=1, query_window=10),
    )
    assert res.stats.extra["num_chunks"] == 6  # 100 - 10 query tokens = 90 context tokens / 16


def test_bad_prefilling_input(dream):
    ok = _parts()
    gen = lambda parts, **c: dllm.generate(
        dream, method="prefilling", prompt=parts, gen_length=4, prefilling=PrefillingConfig(**c)
    )
    with pytest.raises(ValueError, match="context is empty"):
        gen(PromptParts(ok.prefix, torch.zeros(0, dtype=torch.long), ok.query), chunk_size=8)
    with pytest.raises(ValueError, match="query is empty"):
        gen(PromptParts(ok.prefix, ok.context, torch.zeros(0, dtype=torch.long)), chunk_size=8)
    with pytest.raises(ValueError, match="top_k=9 exceeds the 5 chunk"):
        gen(ok, chunk_size=8, top_k=9)
    with pytest.raises(ValueError, match="token_budget"):
        PrefillingConfig(chunk_size=8, token_budget=9)
    with pytest.raises(ValueError, match="chunk_size"):
        PrefillingConfig(chunk_size=0)
    with pytest.raises(ValueError, match="mask token"):
        gen(PromptParts(ok.prefix, torch.tensor([1, dream.mask_token_id, 2]), ok.query), chunk_size=8)
    vocab = dream.config.vocab_size  # an id past the embedding table is an error, not an index crash
    with pytest.raises(ValueError, match=rf"prompt.query token ids must be in \[0, {vocab}\)"):
        gen(PromptParts(ok.prefix, ok.context, torch.tensor([1, vocab])), chunk_size=8)
    with pytest.raises(ValueError, match="prompt.prefix token ids"):
        gen(PromptParts(torch.tensor([-1]), ok.context, ok.query), chunk_size=8)
    with pytest.raises(ValueError, match="position_mode"):
        PrefillingConfig(position_mode="relative")
    with pytest.raises(ValueError, match="pool_kernel"):
        PrefillingConfig(pool_kernel=4)
    with pytest.raises(TypeError, match="PrefillingConfig"):
        dllm.generate(dream, method="prefilling", prompt=ok, prefilling={"chunk_size": 8})
    with pytest.raises(ValueError, match="options of method='prefilling'"):
        dllm.generate(dream, ok.full()[None], method="dense", prefilling=PrefillingConfig())


def test_the_named_steps_compose_into_the_policy(dream):
    """prefill -> score_and_select -> build_cache by hand gives the policy build_prefilling_policy builds."""
    from dllm.prefilling import build_cache, prefill, score_and_select

    parts = _parts(n_ctx=45)
    cfg = PrefillingConfig(chunk_size=8, top_k=2, token_budget=5)
    setup = build_prefilling_policy(dream, None, parts, cfg, PhaseTimer("cpu"), gen_length=4)
    with torch.no_grad():
        pre = prefill(dream, parts, cfg)
        sel = score_and_select(dream, parts, pre.chunks, cfg)
        row = build_cache(dream, parts, pre, sel, cfg, 4)
    assert pre.chunks.num_chunks == 6 and pre.prefix.length == 6 and pre.nfe == 2 and not pre.from_document
    assert sel.kept == setup.selection.kept and len(sel.kept) == 2 and sel.nfe == 3  # draft + 2 passes
    # prefix, then min(B = 5, c_j) + the BOS anchor per kept chunk
    assert [s.length for s in row.segments] == [6] + [min(5, pre.chunks.sizes()[j]) + 1 for j in sel.kept]
    # continuous positions: the query right after the kept chunks, each with its anchor
    assert row.query_start == setup.row.query_start == 6 + sum(pre.chunks.sizes()[j] + 1 for j in sel.kept)
    cache = dllm.StaticKVCache.from_rows([row.segments])
    for a, b in zip(cache.k + cache.v, setup.cache.k + setup.cache.v):
        assert torch.equal(a, b)
    assert setup.policy.nfe == pre.nfe + sel.nfe + row.nfe


@pytest.mark.parametrize(
    ("terms", "mode", "reported"),
    [
        (("draft_contrast",), "dllm", {"s_P", "s_C"}),
        (("self_info",), "dllm", {"s_I"}),
        (("pseudo_label",), "dllm", {"s_P", "s_C"}),  # s_P and s_C come from the same pass
        (("self_info", "pseudo_label"), "dllm", {"s_I", "s_P", "s_C"}),
        (("pseudo_label",), "causal", {"s_I", "s_P", "s_C"}),
    ],
)
def test_stats_report_only_computed_score_terms(dream, terms, mode, reported):
    cfg = PrefillingConfig(chunk_size=8, top_k=2, score_terms=terms, score_mode=mode)
    res = dllm.generate(dream, method="prefilling", prompt=_parts(n_ctx=30), prefilling=cfg, gen_length=4, steps=2)
    assert {"s_I", "s_P", "s_C"} & set(res.stats.extra) == reported
    # the skipped passes are real: causal scores every term in one pass, dllm one pass per term pair
    n_passes = 1 if mode == "causal" else len({"s_I"} & reported) + len({"s_P"} & reported)
    assert res.stats.nfe == 1 + 1 + 1 + n_passes + 2  # chunks, prefix, draft, scoring passes, steps


def test_top_k_is_checked_before_the_prefill(dream, monkeypatch):
    calls = []
    monkeypatch.setattr(dream, "forward", lambda *a, **k: calls.append(1))  # any forward would be recorded
    with pytest.raises(ValueError, match="top_k=6 exceeds the 5 chunk"):
        dllm.generate(dream, method="prefilling", prompt=_parts(), gen_length=4, prefilling=PrefillingConfig(8, 6))
    assert calls == []
