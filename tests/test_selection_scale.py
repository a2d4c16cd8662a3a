"""Chunk boundaries snapped to sentence ends, redundancy-aware top-K, a first stage.

Each knob's off value must reproduce today's tokens; on, each is checked against hand-computed values
or a naive reference.
"""

import dataclasses
import json

import pytest
import torch

import dllm
from dllm.prefilling import PrefillingConfig, PromptParts
from dllm.prefilling.chunks import cut_chunks, snapped_chunks
from dllm.prefilling.positions import chunk_offsets
from dllm.prefilling.selection import (
    first_stage_excess,
    first_stage_scores,
    jaccard,
    ngram_set,
    rank_chunks,
    select_chunks,
)
from tests.tiny_checkpoints import write_dream_checkpoint

BOS = 128  # DREAM_TINY bos_token_id
END = 7  # token id that ends a sentence in the tests' sentence-end table


@pytest.fixture(scope="module")
def dream(tmp_path_factory):
    d = tmp_path_factory.mktemp("dream23")
    write_dream_checkpoint(str(d), seed=23)
    model = dllm.load_model(str(d), device="cpu", dtype=torch.float32)
    table = torch.zeros(model.config.vocab_size, dtype=torch.bool)
    table[END] = True
    model._dllm_sentence_ends = table  # the random checkpoint has no tokenizer: its sentence ends, set here
    return model


def _parts(n_ctx=61, seed=0, ends_every=None):
    g = torch.Generator().manual_seed(seed)
    r = lambda n: torch.randint(8, 120, (n,), generator=g)  # noqa: E731  (ids 8.. hold no sentence end)
    ctx = r(n_ctx)
    if ends_every:
        ctx[ends_every - 1 :: ends_every] = END
    return PromptParts(torch.cat([torch.tensor([BOS]), r(5)]), ctx, r(6))


KW = dict(method="prefilling", gen_length=6, steps=6)


# --- boundaries snapped to sentence ends ----------------------------------------------------------


def test_snapped_chunks_by_hand():
    ends = torch.zeros(30, dtype=torch.bool)
    ends[[3, 8, 17, 24]] = True  # sentences end after tokens 3, 8, 17, 24: boundaries allowed at 4, 9, 18, 25
    # C=10, tol=4: a boundary b may move back to b-4..b: 10 -> 9; 19 -> 18; 28 -> 25; the rest fits
    assert snapped_chunks(ends, 10, 4) == [(0, 9), (9, 9), (18, 7), (25, 5)]
    # tol=1: 10 -> 9; 19 -> 18; 28 stays (25 is 3 back); the rest fits
    assert snapped_chunks(ends, 10, 1) == [(0, 9), (9, 9), (18, 10), (28, 2)]
    assert snapped_chunks(ends, 10, 0) == cut_chunks(30, 10)
    assert snapped_chunks(torch.zeros(30, dtype=torch.bool), 10, 9) == cut_chunks(30, 10)
    with pytest.raises(ValueError, match="tolerance"):
        snapped_chunks(ends, 10, 10)
    with pytest.raises(ValueError, match="empty"):
        snapped_chunks(torch.zeros(0, dtype=torch.bool), 10, 3)


def test_bundled_tokenizer_sentence_ends():
    tiny = dllm.load_model(device="cpu")
    from dllm.prefilling.chunks import sentence_end_table

    table = sentence_end_table(tiny)
    ends = {tiny.tokenizer.convert_ids_to_tokens(i) for i in table.nonzero().flatten().tolist()}
    assert ends == {".", "!", "?", "\n"}


def test_snap_without_sentence_ends_reproduces_fixed_chunks(dream):
    """boundary_snap on a context with no sentence end: today's chunks and tokens exactly."""
    parts = _parts()
    base = PrefillingConfig(chunk_size=8, top_k=2)
    fresh = dllm.generate(dream, prompt=parts, prefilling=base, **KW)
    snap = dllm.generate(dream, prompt=parts, prefilling=dataclasses.replace(base, boundary_snap=5), **KW)
    assert torch.equal(fresh.tokens, snap.tokens)
    assert fresh.stats.extra["all_chunk_scores"] == snap.stats.extra["all_chunk_scores"]


@pytest.mark.parametrize("mode", ["continuous", "absolute", "reuse"])
def test_snapped_chunks_hold_whole_sentences_and_positions_follow_their_offsets(dream, mode, tmp_path):
    """With a sentence end every 6 tokens and C=8, tol=3, every chunk ends on a sentence end (6 tokens each);
    a document encoded with the same knob gives the fresh run's tokens, saved and loaded too."""
    parts = _parts(n_ctx=40, ends_every=6)
    cfg = PrefillingConfig(chunk_size=8, top_k=2, boundary_snap=3, position_mode=mode)
    doc = dllm.encode_document(dream, parts.context, prefilling=cfg)
    assert doc.chunks.sizes() == [6, 6, 6, 6, 6, 6, 4] and doc.chunks.starts == [0, 6, 12, 18, 24, 30, 36]
    fresh = dllm.generate(dream, prompt=parts, prefilling=cfg, **KW)
    doc.save(tmp_path / "d.cache")
    loaded = dllm.DocumentCache.load(tmp_path / "d.cache", dream)
    assert loaded.boundary_snap == 3 and loaded.chunks.starts == doc.chunks.starts
    q = PromptParts(parts.prefix, None, parts.query)
    for d in (doc, loaded):
        assert torch.equal(dllm.generate(dream, prompt=q, document=d, prefilling=cfg, **KW).tokens, fresh.tokens)
    kept = fresh.stats.extra["selected_chunks"]
    starts, q_start = chunk_offsets(mode, 6, kept, doc.chunks.sizes(), 8, chunk_starts=doc.chunks.starts)
    if mode == "absolute":  # the anchor one position before the chunk's first context token
        assert starts == [6 + doc.chunks.starts[j] - 1 for j in kept] and q_start == 6 + 40
    with pytest.raises(ValueError, match="boundary_snap mismatch"):
        dllm.generate(dream, prompt=q, document=doc, prefilling=dataclasses.replace(cfg, boundary_snap=0), **KW)


def _rewrite_header(src, dst, edit):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from dllm.prefilling.document import HEADER_KEY

    with safe_open(str(src), framework="pt") as f:
        head = json.loads(f.metadata()[HEADER_KEY])
    edit(head)
    save_file(load_file(str(src)), str(dst), metadata={HEADER_KEY: json.dumps(head)})


def test_files_of_older_formats_are_a_clear_error(dream, tmp_path):
    """Formats before 4 carry no tokenizer identity: they cannot be checked, so they are refused."""
    parts = _parts(n_ctx=37)
    doc = dllm.encode_document(dream, parts.context, chunk_size=8)
    doc.save(tmp_path / "new.cache")
    assert dllm.DocumentCache.load(tmp_path / "new.cache", dream).chunks.starts == doc.chunks.starts
    older = {3: lambda h: (h.pop("tokenizer"), h.update(format=3)), 1: lambda h: h.update(format=1)}
    older[2] = lambda h: (h.pop("tokenizer"), h.pop("boundary_snap"), h.update(format=2))
    for fmt, edit in older.items():
        _rewrite_header(tmp_path / "new.cache", tmp_path / f"v{fmt}.cache", edit)
        with pytest.raises(ValueError, match=f"format mismatch: .* has format {fmt}, this version reads 4; encode"):
            dllm.DocumentCache.load(tmp_path / f"v{fmt}.cache", dream)


def test_a_snapped_cache_whose_boundaries_do_not_follow_its_sentences_is_damaged(dream, tmp_path):
    parts = _parts(n_ctx=40, ends_every=6)
    cfg = PrefillingConfig(chunk_size=8, boundary_snap=3)
    dllm.encode_document(dream, parts.context, prefilling=cfg).save(tmp_path / "d.cache")
    # the same tensors claiming another tolerance: the layout no longer matches the sentence ends
    _rewrite_header(tmp_path / "d.cache", tmp_path / "bad.cache", lambda h: h.update(boundary_snap=1))
    with pytest.raises(ValueError, match="damaged: its chunk lengths or offsets"):
        dllm.DocumentCache.load(tmp_path / "bad.cache", dream)
    _rewrite_header(tmp_path / "d.cache", tmp_path / "bad2.cache", lambda h: h.update(boundary_snap=8))
    with pytest.raises(ValueError, match="boundary_snap=8 is not below"):
        dllm.DocumentCache.load(tmp_path / "bad2.cache", dream)


# --- redundancy-aware selection -------------------------------------------------------------------


def test_select_chunks_by_hand():
    ids = {0: torch.arange(20), 1: torch.arange(20), 2: torch.arange(1, 21), 3: torch.arange(100, 120)}
    scores = torch.tensor([4.0, 3.0, 2.0, 1.0])
    assert select_chunks(scores, 2) == [0, 1]  # the paper: top-K
    # 8-grams: chunk 1 = chunk 0 (J=1), chunk 2 shares 12 of 14 (J=12/14=0.857), chunk 3 none
    assert jaccard(ngram_set(ids[0]), ngram_set(ids[2])) == pytest.approx(12 / 14)
    assert select_chunks(scores, 2, ids.__getitem__, 0.8) == [0, 3]
    assert select_chunks(scores, 2, ids.__getitem__, 0.9) == [0, 2]
    # every other chunk a near-copy: the passed-over ones fill K in score order
    dup = {j: torch.arange(20) for j in range(4)}
    assert select_chunks(scores, 3, dup.__getitem__, 0.5) == [0, 1, 2]
    # -inf (not a candidate) is never kept while a candidate remains
    assert select_chunks(torch.tensor([1.0, float("-inf"), 0.5]), 2, ids.__getitem__, 0.8) == [0, 2]
    with pytest.raises(ValueError, match="K=5"):
        select_chunks(scores, 5)


@pytest.mark.parametrize("threshold", [float("nan"), float("inf"), 0.0, -0.5, 1.5, True, "0.8"])
def test_select_chunks_refuses_a_threshold_outside_0_1(threshold):
    """threshold=nan was accepted (every Jaccard >= nan is False: the redundancy rule off without
    a word); inf, 0 and the rest are outside (0, 1] too."""
    ids = [torch.tensor([1, 2, 3])] * 3
    with pytest.raises(ValueError, match=r"threshold must be a real number in \(0, 1\]"):
        select_chunks(torch.tensor([3.0, 2.0, 1.0]), 2, ids.__getitem__, threshold)


def test_select_chunks_k_must_be_an_integer():
    np = pytest.importorskip("numpy")
    assert select_chunks(torch.tensor([3.0, 2.0, 1.0]), np.int64(2)) == [0, 1]
    assert select_chunks(torch.tensor([3.0, 2.0, 1.0]), torch.tensor(2)) == [0, 1]
    for bad in (2.5, 2.0, True, torch.tensor(True), torch.tensor(2.0)):
        with pytest.raises(TypeError, match="K must be an integer"):
            select_chunks(torch.tensor([3.0, 2.0, 1.0]), bad)


def test_top_k_ties_go_to_the_earliest_chunk_and_nan_never_wins():
    """``select_chunks(zeros(20), 3)`` was [12, 13, 14] (torch.topk's order) and a NaN won."""
    assert select_chunks(torch.zeros(20), 3) == [0, 1, 2]
    tied = torch.tensor([0.0, 2.0, 1.0, 2.0, 2.0, 1.0])
    assert select_chunks(tied, 2) == [1, 3]
    assert select_chunks(tied, 4) == [1, 2, 3, 4]
    nan = float("nan")
    assert select_chunks(torch.tensor([1.0, nan, 0.5, -2.0]), 3) == [0, 2, 3]
    # below even -inf (not a candidate); chosen only when K leaves no other chunk
    assert select_chunks(torch.tensor([nan, float("-inf"), nan]), 2) == [0, 1]
    ids = {j: torch.arange(100 * j, 100 * j + 20) for j in range(4)}
    assert select_chunks(torch.tensor([nan, 1.0, 1.0, nan]), 2, ids.__getitem__, 0.8) == [1, 2]
    assert select_chunks(torch.tensor([nan, 1.0, 1.0, nan]), 3, ids.__getitem__, 0.8) == [0, 1, 2]
    assert select_chunks(torch.zeros(6), 2, lambda j: torch.arange(20), 0.5) == [0, 1]
    # fp64 scores are ranked as given (a cast to fp32 made 1 and 1 + 1e-12 a tie, and 1e39 and 1e40 both inf)
    assert select_chunks(torch.tensor([1.0, 1.0 + 1e-12], dtype=torch.float64), 1) == [1]
    assert select_chunks(torch.tensor([1e39, 1e40], dtype=torch.float64), 1) == [1]


def test_near_copies_no_longer_crowd_out_the_unique_chunk(dream):
    """A context of one 8-token block repeated, with one distinct chunk: with a threshold it is always kept;
    off (None) reproduces the paper's tokens."""
    g = torch.Generator().manual_seed(3)
    block = torch.randint(8, 120, (8,), generator=g)
    ctx = block.repeat(10)
    ctx[40:48] = torch.randint(8, 120, (8,), generator=g)  # chunk 5 differs
    parts = PromptParts(torch.tensor([BOS]), ctx, torch.randint(8, 120, (5,), generator=g))
    base = PrefillingConfig(chunk_size=8, top_k=2)
    off = dllm.generate(dream, prompt=parts, prefilling=base, **KW)
    # the copies' scores tie (the stats round them to 4 decimals; the tie-break among exact ties is not part
    # of the method): the paper's top-2 is chunk 5 beside the best-scoring copy, or two copies above it
    scores = off.stats.extra["all_chunk_scores"]
    paper = off.stats.extra["selected_chunks"]
    best_copy_score = max(scores[j] for j in range(10) if j != 5)
    if scores[5] >= best_copy_score:
        assert 5 in paper and all(scores[j] == best_copy_score for j in paper if j != 5), scores
    else:
        assert 5 not in paper, scores
    on = dllm.generate(dream, prompt=parts, prefilling=dataclasses.replace(base, redundancy_threshold=0.8), **KW)
    kept = on.stats.extra["selected_chunks"]
    assert on.stats.extra["all_chunk_scores"] == scores
    # with the threshold: the best copy and the distinct chunk 5, whatever their order
    assert len(kept) == 2 and 5 in kept, kept
    other = next(j for j in kept if j != 5)
    assert scores[other] == best_copy_score, (kept, scores)
    # no near-copies in a random context: the threshold changes nothing
    rnd = _parts()
    a = dllm.generate(dream, prompt=rnd, prefilling=base, **KW)
    b = dllm.generate(dream, prompt=rnd, prefilling=dataclasses.replace(base, redundancy_threshold=0.5), **KW)
    assert torch.equal(a.tokens, b.tokens) and a.stats.extra["selected_chunks"] == b.stats.extra["selected_chunks"]


# --- the first stage ------------------------------------------------------------------------------


def _naive_first_stage(model, chunks, query, m, layers):
    """Loops over chunks, query heads, queries and tokens (the definition in first_stage_maxima), then each
    feature's median over the chunks from a sorted list and the mean excess over it (first_stage_excess)."""
    t = chunks.k[0].shape[1]
    live = torch.cat([query, torch.full((m,), model.mask_token_id)])
    qs = {}
    model(
        live[None],
        torch.arange(t, t + live.numel()),
        logits_start=live.numel(),
        attn_hook=lambda i, q, k, v: qs.__setitem__(i, q[0]),
    )
    hq, hkv, d = model.config.num_heads, model.config.num_kv_heads, model.config.head_dim
    rows = []
    for j in range(chunks.num_chunks):
        vals = []
        for layer in layers:
            q = qs[layer][-8:]
            for h in range(hq):
                for i in range(q.shape[0]):
                    best = max(
                        float(q[i, h] @ chunks.k[layer][j, tok, h // (hq // hkv)]) / d**0.5
                        for tok in range(1, int(chunks.lens[j]))
                    )
                    vals.append(best)
        rows.append(vals)
    n = len(rows)
    medians = [sorted(r[f] for r in rows)[(n - 1) // 2] for f in range(len(rows[0]))]  # the lower middle value
    return torch.tensor([sum(max(0.0, x - mf) for x, mf in zip(r, medians)) / len(r) for r in rows])


def test_first_stage_matches_the_naive_definition(dream):
    parts = _parts(n_ctx=43)
    doc = dllm.encode_document(dream, parts.context, chunk_size=8)
    for layer, layers in ((None, [0, 1]), (-1, [1]), (0, [0])):
        got = first_stage_scores(dream, doc.chunks, parts.query, 3, layer)
        want = _naive_first_stage(dream, doc.chunks, parts.query, 3, layers)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert (got >= 0).all() and got.max() > got.min()  # an excess: never below 0, and chunks differ
    with pytest.raises(ValueError, match="candidate_layer=2"):
        first_stage_scores(dream, doc.chunks, parts.query, 3, 2)


def test_first_stage_excess_ignores_what_a_short_chunk_lacks():
    # 5 chunks x 3 features (per-query maxima). Chunk 4 is short: it lacks the common token that sets
    # feature 0 and 1 (4.0 in every other chunk) but is the only one with a high feature 2. The plain mean
    # (the rule before) ranks it last; the excess over each feature's median ranks it first.
    maxima = torch.tensor([[4.0, 4.0, 1.0], [4.0, 4.0, 1.0], [4.0, 4.0, 1.2], [4.0, 4.5, 1.0], [2.0, 2.0, 3.0]])
    assert rank_chunks(maxima.mean(1))[-1] == 4
    got = first_stage_excess(maxima)
    # medians (4, 4, 1): excesses (0,0,0), (0,0,0), (0,0,0.2), (0,0.5,0), (0,0,2) / 3 features
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, 0.2 / 3, 0.5 / 3, 2.0 / 3]))
    assert rank_chunks(got)[:3] == [4, 3, 2]
    two = first_stage_excess(torch.tensor([[1.0, 5.0], [3.0, 2.0]]))  # even N: the lower middle value
    torch.testing.assert_close(two, torch.tensor([1.5, 1.0]))
    for bad in (torch.zeros(3), torch.zeros(0, 2), torch.zeros(2, 0), [[1.0]]):
        with pytest.raises(ValueError, match="maxima"):
            first_stage_excess(bad)


def test_candidates_score_only_the_first_stage_picks(dream):
    parts = _parts(n_ctx=80)  # 10 chunks
    base = PrefillingConfig(chunk_size=8, top_k=2, draft_tokens=3)
    full = dllm.generate(dream, prompt=parts, prefilling=base, **KW)
    # n >= N: no first stage, today's tokens and scores
    same = dllm.generate(dream, prompt=parts, prefilling=dataclasses.replace(base, candidates=10), **KW)
    assert torch.equal(same.tokens, full.tokens) and same.stats.nfe == full.stats.nfe
    assert same.stats.extra["all_chunk_scores"] == full.stats.extra["all_chunk_scores"]
    doc = dllm.encode_document(dream, parts.context, prefilling=base)
    first = first_stage_scores(dream, doc.chunks, parts.query, 3)
    for n, want_n in ((4, 4), (1, 2)):  # fewer candidates than K are raised to K
        res = dllm.generate(dream, prompt=parts, prefilling=dataclasses.replace(base, candidates=n), **KW)
        ex = res.stats.extra
        cands = sorted(torch.topk(first, want_n).indices.tolist())
        assert ex["candidate_chunks"] == cands
        assert [j for j, s in enumerate(ex["all_chunk_scores"]) if s is not None] == cands
        for j in cands:  # a candidate's score is the one of scoring every chunk
            assert ex["all_chunk_scores"][j] == pytest.approx(full.stats.extra["all_chunk_scores"][j], abs=2e-4)
        best = sorted(cands, key=lambda j: -ex["all_chunk_scores"][j])[:2]
        assert ex["selected_chunks"] == sorted(best)
        assert res.stats.nfe == full.stats.nfe + 1  # the first stage's one small forward


def test_candidates_with_a_token_budget_and_joint_mode_decode(dream):
    parts = _parts(n_ctx=80)
    for mode in ("independent", "joint"):
        cfg = PrefillingConfig(chunk_size=8, top_k=2, candidates=3, token_budget=4, cache_mode=mode, pool_kernel=3)
        res = dllm.generate(dream, prompt=parts, prefilling=cfg, **KW)
        assert (res.tokens != dream.mask_token_id).all()
        assert set(res.stats.extra["selected_chunks"]) <= set(res.stats.extra["candidate_chunks"])


# --- the knobs --------------------------------------------------------------------------------------


def test_new_knobs_are_off_by_default_and_checked():
    cfg = PrefillingConfig()
    assert (cfg.boundary_snap, cfg.redundancy_threshold, cfg.candidates, cfg.candidate_layer) == (0, None, None, None)
    from dllm.model.loader import default_model_dir

    bundled = PrefillingConfig.from_pretrained(default_model_dir())
    assert bundled.top_k == 4  # the file was read
    # the bundled model snaps its chunk boundaries (bench/results/tiny_prose_eval: what measured best in
    # held-out prose) and engages the first stage by itself on long documents
    # (bench/results/scale_by_default.md); redundancy stays off
    assert bundled.boundary_snap == 64
    assert (bundled.candidates, bundled.candidate_layer) == ("auto", 0)
    assert "redundancy_threshold" not in bundled.changed_fields()
    for bad, match in (
        (dict(boundary_snap=1024), "boundary_snap"),
        (dict(boundary_snap=-1), "boundary_snap"),
        (dict(redundancy_threshold=0.0), "redundancy_threshold"),
        (dict(redundancy_threshold=1.5), "redundancy_threshold"),
        (dict(redundancy_threshold=True), "redundancy_threshold"),
        (dict(candidates=0), "candidates"),
        (dict(candidates="all"), "candidates"),
        (dict(candidate_layer=1.5), "candidate_layer"),
        (dict(candidate_layer=1), "candidate_layer=1 needs candidates"),  # a layer for a first stage that does not run
    ):
        with pytest.raises(ValueError, match=match):
            PrefillingConfig(**bad)
    assert PrefillingConfig(redundancy_threshold=1).redundancy_threshold == 1.0


def test_cli_flags_encode_snapped_and_answer_with_the_new_knobs(tmp_path, monkeypatch, capsys):
    """encode --boundary-snap, then generate --document (the document's tolerance is taken from its header,
    another one is an error) with --redundancy-threshold and --candidates; bad values are one error line."""
    from dllm.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "doc.txt").write_text(
        "The grass is green. " * 40 + "The pass key is 42917. Remember it. " + "The sky is blue. " * 40
    )
    (tmp_path / "q.txt").write_text("{context}\n\nWhat is the pass key? The pass key is ")
    assert (
        main(
            ["encode", "--context-file", "doc.txt", "--out", "d.cache", "--chunk-size", "128", "--boundary-snap", "24"]
        )
        == 0
    )
    capsys.readouterr()
    assert dllm.DocumentCache.read_header(tmp_path / "d.cache")["boundary_snap"] == 24
    common = ["--prompt-file", "q.txt", "--gen-length", "6", "--top-k", "2", "--stats", "json"]
    new = ["--redundancy-threshold", "0.8", "--candidates", "4"]
    assert main(["generate", "--document", "d.cache", *common, *new]) == 0
    out, err = capsys.readouterr()
    stats = [json.loads(line) for line in err.strip().splitlines() if line.startswith("{")][0]
    # 4 from the first stage, and those of the K=2 best lexical chunks it left out (the defaults' lexical_weight)
    assert 4 <= len(stats["candidate_chunks"]) <= 4 + 2
    assert set(stats["selected_chunks"]) <= set(stats["candidate_chunks"])
    fresh = ["generate", "--method", "prefilling", "--context-file", "doc.txt", "--chunk-size", "128"]
    assert main([*fresh, *common, *new, "--boundary-snap", "24"]) == 0
    assert capsys.readouterr().out == out  # the same answer fresh
    for args, message in (
        (["generate", "--document", "d.cache", *common, "--boundary-snap", "0"], "was encoded with 24"),
        ([*fresh, *common, "--redundancy-threshold", "0"], "--redundancy-threshold must be"),
        ([*fresh, *common, "--boundary-snap", "128"], "--boundary-snap must be in"),
    ):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1


def test_benches_write_their_reports(tmp_path):
    """bench.studies.selection_scale and bench.fidelity.long_context on small documents: CSV with provenance, Markdown,
    figure."""
    import csv

    from bench.fidelity import long_context
    from bench.studies import selection_scale

    out = tmp_path / "s"
    argv = ["--out", str(out), "--long-length", "2048", "--depths", "0.5", "--straddle-length", "1024"]
    assert selection_scale.main([*argv, "--offsets", "6", "--needles", "single"]) == 0
    rows = list(csv.DictReader(open(out / "selection_scale.csv")))
    assert {r["part"] for r in rows} == {"first_stage", "encode", "long", "straddle"} and all(r["commit"] for r in rows)
    long_rows = [r for r in rows if r["part"] == "long"]
    assert {r["config"] for r in long_rows} == {"today", "redundancy", "first_stage", "all"} and len(long_rows) == 16
    md = (out / "selection_scale.md").read_text()
    assert "Candidate count used: " in md and "| single | 6 |" in md
    out = tmp_path / "l"
    assert (
        long_context.main(
            ["--out", str(out), "--lengths", "512", "1024", "--depths", "0.5", "--config", "today", "--questions", "2"]
        )
        == 0
    )
    rows = list(csv.DictReader(open(out / "long_context.csv")))
    assert [(int(r["length"]), int(r["question"])) for r in rows] == [(512, 0), (512, 1), (1024, 0), (1024, 1)]
    assert all(r["commit"] for r in rows) and len({r["encode_s"] for r in rows if r["length"] == "1024"}) == 1
    assert (out / "long_context.png").stat().st_size > 0 and "| 1024 |" in (out / "long_context.md").read_text()


def test_straddle_snap_flag_moves_the_cut_off_the_needle(tmp_path):
    """--snap sets the straddle part's tolerance: with 64 tokens a needle cut 6 characters after its start is whole."""
    import csv

    from bench.studies import selection_scale

    out = tmp_path / "s"
    argv = ["--out", str(out), "--skip-long", "--straddle-length", "1024", "--offsets", "6", "--needles", "single"]
    assert selection_scale.main([*argv, "--snap", "64"]) == 0
    rows = {r["config"]: r for r in csv.DictReader(open(out / "selection_scale.csv"))}
    # the fixed cut falls 6 characters into the needle; a sentence end lies within 64 tokens before it
    assert rows["today"]["needle_whole_in_a_chunk"] == "0" and rows["snap"]["needle_whole_in_a_chunk"] == "1"
    assert "(straddle part: 64)" in (out / "selection_scale.md").read_text()
    assert selection_scale.main([*argv, "--snap", "256"]) == 2  # C = 256: a snap must stay below it
