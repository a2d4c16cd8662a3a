"""Re-selection at block starts (:mod:`dllm.prefilling.reselect`): the chunks re-scored against query + answer.

The reference is independent of the re-selection code: a fresh prefilling setup whose query is the question
followed by the answer so far must keep the same chunks, put them in the same static cache (bit for bit) and
start the query at the same position as the re-selection did in the middle of a generation; and nothing is
encoded again.
"""

import sys

import pytest
import torch

import dllm
from dllm.decode.timer import PhaseTimer
from dllm.prefilling import PrefillingConfig, PromptParts, build_prefilling_policy
from dllm.prefilling import chunks as chunks_module
from dllm.prefilling.reselect import Reselector
from tests.tiny_checkpoints import tiny_model_fixtures

BOS = 128

dream, llada = tiny_model_fixtures(dream_seed=61, llada_seed=62, llada_kv_heads=2)

# the lexical term makes the answer's words pull their chunk in: a re-selection that changes the kept set
CFG = PrefillingConfig(chunk_size=8, top_k=2, lexical_weight=5.0, boundary_snap=0)


def _ids(n, seed):
    return torch.randint(0, 90, (n,), generator=torch.Generator().manual_seed(seed))


def _parts(seed=0, n_ctx=48):
    return PromptParts(torch.cat([torch.tensor([BOS]), _ids(4, seed)]), _ids(n_ctx, seed + 1), _ids(5, seed + 2))


def _answer_from_another_chunk(setup, parts, width=4):
    """``width`` tokens copied from a chunk the question did not keep (the answer 'talks about' it)."""
    kept = setup.selection.kept
    other = next(j for j in range(parts.context.numel() // 8) if j not in kept)
    return parts.context[8 * other : 8 * other + width], other


def test_a_reselection_equals_a_fresh_selection_for_query_plus_answer(dream, monkeypatch):
    parts = _parts()
    timer = PhaseTimer("cpu")
    setup = build_prefilling_policy(dream, None, parts, CFG, timer, gen_length=12)
    policy = setup.policy
    policy.reselector = Reselector(dream, setup.rows, setup.cfg, 1, 12, timer)
    answer, other = _answer_from_another_chunk(setup, parts)
    resp = torch.full((1, 12), dream.mask_token_id)
    resp[0, :4] = answer
    encoded = []
    real = chunks_module.encode_chunks
    monkeypatch.setattr(chunks_module, "encode_chunks", lambda *a, **k: encoded.append(1) or real(*a, **k))
    nfe = policy.nfe
    policy.prepare(resp, slice(4, 8), 0)
    assert encoded == []  # no chunk encoded again
    assert policy.nfe > nfe  # the draft and scoring forwards are counted
    fresh = build_prefilling_policy(
        dream, None, PromptParts(parts.prefix, parts.context, torch.cat([parts.query, answer])), CFG, timer,
        gen_length=12,
    )  # fmt: skip
    [(at, kept)] = policy.reselector.history[0]
    assert at == 4 and kept == fresh.selection.kept != setup.selection.kept and other in kept
    got, want = policy.cache, fresh.cache
    assert torch.equal(got.seg_slots, want.seg_slots) and torch.equal(got.seg_lens, want.seg_lens)
    for layer in range(dream.config.num_layers):
        assert torch.equal(got.k[layer], want.k[layer]) and torch.equal(got.v[layer], want.v[layer])
    # the live block starts where the fresh setup's query would (continuous positions)
    q = parts.query.numel()
    assert policy.live.positions[0, 0].item() == fresh.row.query_start
    assert torch.equal(policy.live.positions[0], fresh.row.query_start + torch.arange(q + 12))
    cos, _ = dream.rope.cos_sin(policy.live.positions)
    assert torch.equal(policy.live.cos, cos)


def test_generate_reports_reselections_and_follows_the_answer(dream):
    kw = dict(method="prefilling", prompt=_parts(), prefilling=CFG, gen_length=12, steps=12, block_length=4)
    off = dllm.generate(dream, **kw)
    on = dllm.generate(dream, reselect=1, **kw)
    every2 = dllm.generate(dream, reselect=2, **kw)
    assert "reselections" not in off.stats.extra
    assert on.stats.extra["reselections"] == 2 and [h[0] for h in on.stats.extra["reselected_chunks"]] == [4, 8]
    assert every2.stats.extra["reselections"] == 1 and every2.stats.extra["reselected_chunks"][0][0] == 8
    # block 0 is decoded from the question's selection in every run
    assert torch.equal(on.tokens[0, :4], off.tokens[0, :4])
    assert on.stats.nfe > off.stats.nfe and on.stats.extra["selected_chunks"] == off.stats.extra["selected_chunks"]


def test_a_batch_reselects_each_row_and_an_ended_answer_keeps_its_chunks(dream):
    rows = [_parts(0), _parts(5, n_ctx=40)]
    timer = PhaseTimer("cpu")
    setup = build_prefilling_policy(dream, None, rows, CFG, timer, gen_length=8)
    rs = Reselector(dream, setup.rows, setup.cfg, 1, 8, timer)
    resp = torch.full((2, 8), dream.mask_token_id)
    resp[0, :4] = _ids(4, 9)
    resp[1, :4] = _ids(4, 9)
    resp[1, 2] = dream.config.eos_token_id  # row 1's answer ended: nothing to re-select for
    cache, starts = rs(resp, 4)
    assert [len(h) for h in rs.history] == [1, 0] and rs.count == 1
    assert cache.batch_size == 2 and starts[1] == setup.rows[1].row.query_start
    # row 1's segments are its own from before
    n1 = int((setup.cache.seg_slots[1] >= 0).sum())
    assert torch.equal(cache.seg_lens[1, :n1], setup.cache.seg_lens[1, :n1])


@pytest.mark.parametrize(
    "kw, error, match",
    [
        (dict(method="dense", reselect=1), ValueError, "option of method='prefilling'"),
        (dict(reselect=-1), ValueError, ">= 0"),
        (dict(reselect=True), TypeError, "integer"),
        (dict(reselect=1.5), TypeError, "integer"),
        (dict(reselect=1, cuda_graph=True), ValueError, "cuda_graph=True cannot"),
        (dict(reselect=1, block_length=8), ValueError, "several blocks"),  # one block: it re-selected nothing
        (dict(reselect=1, prefilling=PrefillingConfig(chunk_size=8, top_k=2, cache_mode="joint")), ValueError, "joint"),
    ],
)
def test_bad_reselect(dream, kw, error, match, monkeypatch):
    kw = {"method": "prefilling", "prompt": _parts(), "prefilling": CFG, "gen_length": 8, "block_length": 4, **kw}
    if kw["method"] == "dense":
        kw = {"method": "dense", "input_ids": _ids(9, 0)[None], "gen_length": 8, "reselect": 1}
    if kw.get("cuda_graph"):  # as where graphs are supported: the combination itself is refused
        monkeypatch.setattr(sys.modules["dllm.generate"], "cuda_graph_support", lambda device: (True, ""))
    with pytest.raises(error, match=match):
        dllm.generate(dream, **kw)
