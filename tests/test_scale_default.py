"""The first stage engages by itself (``candidates="auto"``, the bundled default) and a fresh
context with it is encoded in two passes (every chunk's layer-0 keys, then the candidates in full).

The rule is checked against values computed by hand; the two-pass encoding against a full encoding of the
same chunks (its candidates' K/V equal, the same chunks kept, the same tokens as from a document cache).
"""

import dataclasses
import math

import pytest
import torch

import dllm
from dllm.prefilling import PrefillingConfig, PromptParts
from dllm.prefilling.chunks import encode_candidates
from dllm.prefilling.config import auto_candidates
from dllm.prefilling.pipeline import two_pass_candidates
from dllm.prefilling.selection import first_stage_candidates, first_stage_scores
from tests.tiny_checkpoints import write_dream_checkpoint

BOS = 128  # DREAM_TINY bos_token_id
KW = dict(method="prefilling", gen_length=6, steps=6)


@pytest.fixture(scope="module")
def dream(tmp_path_factory):
    d = tmp_path_factory.mktemp("dream36")
    write_dream_checkpoint(str(d), seed=36)
    return dllm.load_model(str(d), device="cpu", dtype=torch.float32)


def _parts(n_ctx, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda n: torch.randint(8, 120, (n,), generator=g)  # noqa: E731
    return PromptParts(torch.cat([torch.tensor([BOS]), r(5)]), r(n_ctx), r(6))


def test_auto_rule_by_hand():
    # n = max(8 K, ceil(sqrt(N))), used only when 2 n < N
    assert auto_candidates(64, 4) is None  # n = 32 would leave out exactly half: not engaged
    assert auto_candidates(65, 4) == 32  # the first document it engages on at K=4 (16K tokens at C=256)
    assert auto_candidates(530, 4) == 32  # 128K tokens at C=256: 8 K above ceil(23.02)
    assert auto_candidates(1025, 4) == 33  # ceil(32.02): from here sqrt(N) is above 8 K (256K tokens)
    assert auto_candidates(4237, 4) == 66  # 1M tokens: ceil(65.09)
    assert auto_candidates(10**6, 4) == 1000
    assert auto_candidates(16, 1) is None and auto_candidates(17, 8) is None  # short documents: every chunk
    assert auto_candidates(17, 1) == 8  # K=1: 8 K of 17 chunks leaves out more than half
    for k in (1, 2, 4, 8, 16):
        for n in range(1, 5000, 7):
            got = auto_candidates(n, k)
            if got is not None:
                assert 8 * k <= got and 2 * got < n and got >= math.ceil(math.sqrt(n))
                assert got == auto_candidates(n, k)  # a function of N and K alone
    # sublinear: the share of chunks scored falls as N grows
    shares = [auto_candidates(n, 4) / n for n in (100, 1000, 10_000, 100_000)]
    assert shares == sorted(shares, reverse=True) and shares[-1] < 0.01
    for bad in ((0, 4), (10, 0), (True, 4), (10, 1.5)):
        with pytest.raises(ValueError):
            auto_candidates(*bad)


def test_first_stage_candidates_by_hand():
    s = torch.tensor([0.1, 0.9, 0.3, 0.8, 0.2, float("nan"), 0.7, 0.0])
    assert first_stage_candidates(s, 3) == [1, 3, 6]  # the 3 best
    assert first_stage_candidates(s, 3, 1) == [0, 1, 2, 3, 6]  # + the neighbours of the best (chunk 1)
    assert first_stage_candidates(s, 3, 2) == [0, 1, 2, 3, 4, 6]  # and of the second (chunk 3)
    assert first_stage_candidates(torch.tensor([1.0, 0.0]), 1, 1) == [0, 1]  # no neighbour outside [0, N)
    assert (
        PrefillingConfig(candidates="auto").neighbours_of(4) == 4
        and PrefillingConfig(candidates=9).neighbours_of(4) == 0
    )
    for bad in ((0, 0), (9, 0), (2, -1)):
        with pytest.raises(ValueError):
            first_stage_candidates(s, *bad)


def test_candidate_count_is_the_one_rule():
    assert PrefillingConfig().candidate_count(1000, 4) is None  # the paper: every chunk scored
    assert PrefillingConfig(candidates=3).candidate_count(10, 4) == 4  # raised to K
    assert PrefillingConfig(candidates=12).candidate_count(10, 4) is None  # n >= N: no first stage
    auto = PrefillingConfig(candidates="auto")
    assert [auto.candidate_count(n, 4) for n in (64, 65, 530, 4237)] == [None, 32, 32, 66]
    with pytest.raises(ValueError, match="candidates"):
        PrefillingConfig(candidates="some")
    with pytest.raises(ValueError, match="candidates"):
        PrefillingConfig(candidates=0)


def test_layer_keys_equal_the_full_forward(dream):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(8, 120, (3, 9), generator=g)
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[1, 6:] = False  # a padded row
    pos = torch.arange(9)
    full = dream(ids, pos, attention_mask=mask, logits_start=9, return_kv=True)
    for layer in (0, 1, -1):
        got = dream.layer_keys(ids, pos, layer, attention_mask=mask)
        torch.testing.assert_close(got, full.k[layer], rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="layer=2"):
        dream.layer_keys(ids, pos, 2)


def test_fresh_two_pass_equals_a_full_encoding(dream):
    parts = _parts(320)  # 40 chunks of 8: K=1 -> n = max(8, ceil(sqrt 40)) = 8, 16 < 40: engaged
    cfg = PrefillingConfig(chunk_size=8, top_k=1, draft_tokens=3, candidates="auto", candidate_layer=0)
    assert two_pass_candidates(dream, parts, cfg) == 8
    fresh = dllm.generate(dream, prompt=parts, prefilling=cfg, **KW)
    doc = dllm.encode_document(dream, parts.context, prefilling=cfg)  # every chunk in full
    cached = dllm.generate(
        dream, prompt=PromptParts(parts.prefix, None, parts.query), document=doc, prefilling=cfg, **KW
    )
    cands = fresh.stats.extra["candidate_chunks"]
    # the 8 best of the full encoding's layer-0 first stage, and the two neighbours of the best (K=1)
    want = first_stage_candidates(first_stage_scores(dream, doc.chunks, parts.query, 3, 0), 8, 1)
    assert 8 <= len(cands) <= 10 and cands == want == cached.stats.extra["candidate_chunks"]
    assert fresh.stats.extra["selected_chunks"] == cached.stats.extra["selected_chunks"]
    assert torch.equal(fresh.tokens, cached.tokens)
    # the candidates' K/V are those of the full encoding; the other chunks were not encoded at all
    chunks, _nfe, got = encode_candidates(dream, parts.context, cfg, BOS, 0, lambda keys: cands)
    assert got == cands
    rest = [j for j in range(40) if j not in cands]
    for a, b in zip(chunks.k + chunks.v, doc.chunks.k + doc.chunks.v):
        torch.testing.assert_close(a[cands], b[cands], rtol=0, atol=1e-5)
        assert not a[rest].any()
    assert chunks.starts == doc.chunks.starts and torch.equal(chunks.ids, doc.chunks.ids)


def test_short_documents_and_all_layers_score_every_chunk_or_encode_all(dream):
    parts = _parts(128)  # 16 chunks: n = 8 would leave out exactly half: not engaged
    cfg = PrefillingConfig(chunk_size=8, top_k=1, draft_tokens=3, candidates="auto", candidate_layer=0)
    paper = dataclasses.replace(cfg, candidates=None, candidate_layer=None)
    res, ref = (dllm.generate(dream, prompt=parts, prefilling=c, **KW) for c in (cfg, paper))
    assert "candidate_chunks" not in res.stats.extra and torch.equal(res.tokens, ref.tokens)
    assert res.stats.extra["all_chunk_scores"] == ref.stats.extra["all_chunk_scores"]
    # all layers: the first stage engages in scoring, but a fresh context is encoded whole (one pass)
    long = _parts(320)
    every_layer = dataclasses.replace(cfg, candidate_layer=None)
    assert two_pass_candidates(dream, long, every_layer) is None
    assert (
        8 <= len(dllm.generate(dream, prompt=long, prefilling=every_layer, **KW).stats.extra["candidate_chunks"]) <= 10
    )


def test_cli_and_harness_read_auto_and_all():
    from dllm.cli.args import candidates_arg
    from dllm.harness.args import parse_model_args

    assert (candidates_arg("auto"), candidates_arg("all"), candidates_arg("7")) == ("auto", "all", 7)
    assert parse_model_args({}).prefilling.candidates == "auto"  # the bundled default
    assert parse_model_args({"candidates": "all"}).prefilling.candidates is None  # overrides the file
    assert parse_model_args({"candidates": "auto", "candidate_layer": "all"}).prefilling.candidate_layer is None
    assert parse_model_args({"candidates": "5"}).prefilling.candidates == 5


def test_candidates_all_over_the_bundled_defaults_drops_their_layer(tmp_path):
    """The bundled file sets candidates="auto" with candidate_layer=0; turning the first stage off over it
    (`--candidates all`, `from_pretrained(candidates=None)`) must not trip the rule that a layer needs a
    first stage: the file's layer goes with the stage. An explicit layer with no stage is still refused."""
    import subprocess
    import sys

    from dllm.model.loader import default_model_dir

    d = default_model_dir()
    base = PrefillingConfig.from_pretrained(d)
    assert (base.candidates, base.candidate_layer) == ("auto", 0)
    off = PrefillingConfig.from_pretrained(d, candidates=None)
    assert (off.candidates, off.candidate_layer, off.top_k) == (None, None, base.top_k)
    with pytest.raises(ValueError, match="candidate_layer=0 needs candidates"):
        PrefillingConfig.from_pretrained(d, candidates=None, candidate_layer=0)
    ctx = tmp_path / "ctx.txt"
    ctx.write_text("The pass key is 71432. Remember it.\n")
    proc = subprocess.run(
        [sys.executable, "-m", "dllm", "generate", "--context-file", str(ctx), "--question", "Key?",
         "--candidates", "all", "--gen-length", "4", "--steps", "4", "--block-length", "4"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def test_the_bench_compares_the_bundled_defaults_with_every_chunk_scored():
    """bench.studies.scale_default's two configurations build over the bundled file (a replace that kept the file's
    candidate_layer with candidates=None stopped the bench before its first case)."""
    from bench.studies.scale_default import configs

    cfgs = configs()
    assert (cfgs["defaults"].candidates, cfgs["defaults"].candidate_layer) == ("auto", 0)
    assert (cfgs["every"].candidates, cfgs["every"].candidate_layer) == (None, None)
    assert dataclasses.replace(cfgs["every"], candidates="auto", candidate_layer=0) == cfgs["defaults"]
