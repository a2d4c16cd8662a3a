"""dllm.distributed on this CPU: 2 and 3 gloo processes spawned by the test (one thread each, bounded in time).

The references are single-process runs in the test process: ``dllm.encode_document`` of the whole
document, ``dllm.prefilling.score_and_select`` over all its chunks, and ``dllm.generate`` from it. On the
CPU a chunk's K/V and scores do not depend on which other chunks share its forward, so the sharded
results must be bit-equal (``torch.equal``), not merely close.
"""

import dataclasses
import datetime
import functools
import os
import time

import pytest
import torch

import dllm
import dllm.distributed as dd
from bench.speed.distributed import run_ranks
from dllm.distributed.group import world as group_world
from dllm.distributed.index_file import shard_path
from dllm.eval.tasks import make_case
from dllm.prefilling import PrefillingConfig, PromptParts, cut_chunks, score_and_select
from dllm.prefilling.config import auto_candidates

MODEL_DIR = os.path.join(os.path.dirname(dllm.__file__), "assets", "tiny-dream")
GEN = dict(gen_length=8)
# A: the bundled model's score (s_C - s_P), continuous positions, independent caches.
# B: the paper's s_I + s_P, reuse positions, a joint cache with a token budget.
CONFIGS = {
    "A": PrefillingConfig(chunk_size=128, top_k=2, score_terms=("draft_contrast",)),
    "B": PrefillingConfig(chunk_size=128, top_k=3, token_budget=32, cache_mode="joint", position_mode="reuse"),
}
# the checkpoint's defaults with a first stage of 9 candidates and redundancy-aware top-K
# (the lexical term off: it would add its best chunks to the 9 and make the needle's chunk stand out so far that
# redundancy no longer changes the choice; the defaults below run with it)
STAGED = dataclasses.replace(
    PrefillingConfig.from_pretrained(MODEL_DIR), candidates=9, redundancy_threshold=0.3, lexical_weight=0.0
)
# adaptive K with every chunk as the ceiling (top_k None): the chunks are scored and K chosen in 1..N across ranks too
ALL_ADAPTIVE = dataclasses.replace(PrefillingConfig.from_pretrained(MODEL_DIR), top_k=None, adaptive_k=1.5)
# the defaults' first stage (candidates="auto") engaged: C=64 cuts the long case into ~45 chunks, K=1 -> 8 candidates
AUTO = dataclasses.replace(PrefillingConfig.from_pretrained(MODEL_DIR), chunk_size=64, boundary_snap=16, top_k=1)
SHORT = PrefillingConfig(chunk_size=384, top_k=2, score_terms=("draft_contrast",))  # 3 chunks, the last of 131 tokens
GLOO_TIMEOUT_S = 300  # a rank waits this long for a peer (rank 2 waits through the 2-rank steps)
TIMEOUT_S = 600  # the whole group, spawn and imports included (seconds on an idle machine; minutes when loaded)


def _inputs(model):
    """A passkey case of 899 tokens (8 chunks of 128, the last of 3 tokens), its prefix and query."""
    case = make_case("passkey", 900, 0.6, 3)
    ctx = dllm.encode_text(model, case.context)
    parts = PromptParts(dllm.encode_text(model, case.prefix, bos=True), None, dllm.encode_text(model, case.query))
    return ctx, parts


def _long_inputs(model):
    """A passkey case of ~2700 tokens: 11-12 chunks of at most 256 snapped to sentence ends (the defaults)."""
    case = make_case("passkey", 2700, 0.4, 5)
    ctx = dllm.encode_text(model, case.context)
    parts = PromptParts(dllm.encode_text(model, case.prefix, bos=True), None, dllm.encode_text(model, case.query))
    return ctx, parts


@functools.cache
def _load():
    return dllm.load_model(MODEL_DIR, device="cpu", dtype=torch.float32)


def _terms(sel):
    return {t: getattr(sel.scores, t) for t in ("self_info", "pseudo_label", "answer_confidence", "total")}


# ----------------------------------------------------------------------------- the spawned ranks


def _worker(rank, world, init_file, out_dir):
    """One rank of the whole scenario; its results (or its RankError) saved per step to ``rank<r>.pt``."""
    torch.set_num_threads(1)
    dist = torch.distributed
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S),
    )
    out = {}
    model = _load()
    pair = dist.new_group([0, 1])  # the 2-rank steps run on ranks 0 and 1 while rank 2 waits
    steps = (("two", _fresh, pair), ("three", _reload, None), ("fails", _fails, None),
             ("defaults2", _defaults, pair), ("defaults3", _defaults, None))  # fmt: skip
    for step, fn, group in steps:
        if group is not pair or rank < 2:
            try:
                out[step] = fn(model, rank, out_dir, group)
            except dd.RankError as exc:
                out[step] = {"rank_error": (exc.rank, exc.kind, exc.message, exc.user_error)}
        dist.barrier()
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    # last: rank 2 dies (no exception, no goodbye) before a collective; its peers must fail, not wait
    if rank == 2:
        os._exit(3)
    t0 = time.monotonic()
    try:
        dd.run_on_all(lambda: 1)
        out["dies"] = {"no_error": True}
    except dd.RankError as exc:
        out["dies"] = {
            "rank_error": (exc.rank, exc.kind, exc.message, exc.user_error),
            "seconds": time.monotonic() - t0,
        }
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    os._exit(0)  # the group is broken: no destroy_process_group


def _fresh(model, rank, out_dir, group):
    """Encode sharded, gather, score, generate, save; then answer again from the saved shards."""
    ctx, parts = _inputs(model)
    root = parts if rank == 0 else None
    doc = dd.encode_document(model, ctx, prefilling=CONFIGS["A"], group=group)
    out = {"bounds": doc.bounds, "local_k0": doc.local.chunks.k[0].clone(), "first": doc.first_chunk}
    full = doc.gather()
    if full is not None:
        c = full.chunks
        out["full"] = {"k": c.k, "v": c.v, "ids": c.ids, "lens": c.lens, "starts": c.starts}
    sel, _nfe = dd.score_and_select(model, doc, root, CONFIGS["B"])  # the exact scores (generate rounds them)
    out["kept_B"], out["scores_B"] = sel.kept, _terms(sel)
    for name, cfg in CONFIGS.items():
        res = dd.generate(model, doc, root, prefilling=cfg, **GEN)
        if res is not None:
            out[f"tokens_{name}"] = res.tokens
            out[f"extra_{name}"] = res.stats.extra
    doc.save(os.path.join(out_dir, "doc.idx"))
    again = dd.ShardedDocument.load(os.path.join(out_dir, "doc.idx"), model, group=group)
    res = dd.generate(model, again, root, prefilling=CONFIGS["A"], **GEN)
    if res is not None:
        out["tokens_saved_A"] = res.tokens
    return out


def _reload(model, rank, out_dir, group):
    """Load the 2-rank save on 3 ranks, answer; encode a 3-chunk document (one chunk each, the last short)."""
    ctx, parts = _inputs(model)
    root = parts if rank == 0 else None
    doc = dd.ShardedDocument.load(os.path.join(out_dir, "doc.idx"), model, group=group)
    out = {"bounds": doc.bounds}
    for name, cfg in CONFIGS.items():
        res = dd.generate(model, doc, root, prefilling=cfg, **GEN)
        if res is not None:
            out[f"tokens_saved_{name}"] = res.tokens
    short = dd.encode_document(model, ctx, prefilling=SHORT, group=group)
    out["short_width"] = short.local.chunks.k[0].shape[1]
    sel, _nfe = dd.score_and_select(model, short, root, SHORT)
    out["scores_short"] = _terms(sel)
    res = dd.generate(model, short, root, prefilling=SHORT, **GEN)
    if res is not None:
        out["tokens_short"] = res.tokens
    full = short.gather()
    if full is not None:
        out["short_full_k0"], out["short_lens"] = full.chunks.k[0], full.chunks.lens
    return out


def _defaults(model, rank, out_dir, group):
    """The bundled defaults (boundary_snap, K=4) and the first stage with redundancy-aware selection, sharded:
    the snapped chunks, the gathered cache, the kept chunks and the tokens (compared with one process)."""
    ctx, parts = _long_inputs(model)
    root = parts if rank == 0 else None
    doc = dd.encode_document(model, ctx, group=group)  # prefilling=None: the checkpoint's defaults
    out = {"spans": doc.spans, "bounds": doc.bounds, "snap": doc.boundary_snap}
    full = doc.gather()
    if full is not None:
        c = full.chunks
        out["full"] = {"k": c.k, "v": c.v, "ids": c.ids, "lens": c.lens, "starts": c.starts}
    for name, cfg in (("defaults", None), ("staged", STAGED), ("all_adaptive", ALL_ADAPTIVE)):
        res = dd.generate(model, doc, root, prefilling=cfg, **GEN)
        if res is not None:
            out[f"tokens_{name}"], out[f"extra_{name}"] = res.tokens, res.stats.extra
    doc.save(os.path.join(out_dir, f"snapped{group_world(group)[1]}.idx"))
    small = dd.encode_document(model, ctx, prefilling=AUTO, group=group)
    res = dd.generate(model, small, root, prefilling=AUTO, **GEN)
    if res is not None:
        out["tokens_auto"], out["extra_auto"] = res.tokens, res.stats.extra
    return out


def _fails(model, rank, out_dir, group):
    """Rank 1 is given other token ids: every rank must raise the same RankError, and nothing hangs."""
    ctx, _parts = _inputs(model)
    if rank == 1:
        ctx = ctx.clone()
        ctx[5] = (ctx[5] + 1) % 90 + 4
    dd.encode_document(model, ctx, prefilling=CONFIGS["A"], group=group)
    return {"no_error": True}


def _spawn(world, out_dir, timeout=TIMEOUT_S):
    """Run :func:`_worker` on ``world`` gloo ranks (processes started by the test); each rank's results and
    exit code (every rank killed on timeout)."""
    init_file = os.path.join(out_dir, "init")
    # forked where fork exists (run_ranks' START_METHOD): a spawned rank imports torch afresh (~5 CPU-seconds
    # each, minutes on a loaded 2-core machine); a forked one starts with the test's torch and model (one
    # intra-op thread, no CUDA)
    procs, killed = run_ranks(_worker, world, (world, init_file, str(out_dir)), timeout)
    assert not killed, f"{killed} rank(s) still running after {timeout} s"
    results = []
    for r in range(world):
        f = os.path.join(out_dir, f"rank{r}.pt")
        results.append(torch.load(f, weights_only=False) if os.path.exists(f) else None)
    return results, [p.exitcode for p in procs]


# ----------------------------------------------------------------------------- single-process references


@pytest.fixture(scope="module")
def ref():
    torch.set_num_threads(1)
    model = _load()
    ctx, parts = _inputs(model)
    out = {}
    for name, cfg in {**CONFIGS, "short": SHORT}.items():
        doc = dllm.encode_document(model, ctx, prefilling=cfg)
        out[f"doc_{name}"] = doc
        sel = score_and_select(model, parts, doc.chunks, cfg)
        out[f"kept_{name}"], out[f"scores_{name}"] = sel.kept, _terms(sel)
        res = dllm.generate(model, method="prefilling", prompt=parts, document=doc, prefilling=cfg, **GEN)
        out[f"tokens_{name}"], out[f"extra_{name}"] = res.tokens, res.stats.extra
    ctx, parts = _long_inputs(model)
    doc = out["doc_defaults"] = dllm.encode_document(model, ctx)  # the bundled defaults, in one process
    for name, cfg in (("defaults", None), ("staged", STAGED), ("all_adaptive", ALL_ADAPTIVE)):
        res = dllm.generate(model, method="prefilling", prompt=parts, document=doc, prefilling=cfg, **GEN)
        out[f"tokens_{name}"], out[f"extra_{name}"] = res.tokens, res.stats.extra
    # the first stage engaged by itself, fresh (two passes: layer-0 keys, then the candidates) in one process
    res = dllm.generate(
        model, method="prefilling", prompt=PromptParts(parts.prefix, ctx, parts.query), prefilling=AUTO, **GEN
    )
    out["tokens_auto"], out["extra_auto"] = res.tokens, res.stats.extra
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One group of 3 ranks: the 2-rank steps (on ranks 0, 1; they save doc.idx), the 3-rank steps, the errors."""
    d = tmp_path_factory.mktemp("dist")
    results, codes = _spawn(3, d)
    assert all(r is not None for r in results), results
    return {
        "defaults2": [r["defaults2"] for r in results[:2]],
        "defaults3": [r["defaults3"] for r in results],
        "two": [r["two"] for r in results[:2]],
        "three": [r["three"] for r in results],
        "fails": [r["fails"] for r in results],
        "dies": results[0].get("dies"),
        "codes": codes,
        "dir": d,
    }


def _equal_terms(got, want):
    for t, w in want.items():
        if w is None:
            assert got[t] is None, t
        else:
            assert torch.equal(got[t], w.float().cpu()), (t, got[t], w)


def test_every_step_succeeded_on_every_rank(runs):
    for r in runs["two"] + runs["three"] + runs["defaults2"] + runs["defaults3"]:
        assert r is not None and "rank_error" not in r, r


def test_sharded_cache_equals_single_process(runs, ref):
    two = runs["two"]
    want = ref["doc_A"].chunks
    assert two[0]["bounds"] == [(0, 4), (4, 8)] and [r["first"] for r in two] == [0, 4]
    # each rank holds exactly its own rows
    assert torch.equal(two[0]["local_k0"], want.k[0][:4])
    assert torch.equal(two[1]["local_k0"][:, :4], want.k[0][4:, :4])  # the last chunk: 3 tokens + BOS valid
    full = two[0]["full"]
    assert full["starts"] == want.starts and torch.equal(full["lens"], want.lens) and torch.equal(full["ids"], want.ids)
    for layer in range(len(want.k)):
        for got, w in ((full["k"][layer], want.k[layer]), (full["v"][layer], want.v[layer])):
            for j, n in enumerate(want.lens.tolist()):  # valid rows bit for bit (padding is never read)
                assert torch.equal(got[j, :n], w[j, :n]), (layer, j)
    assert "full" not in two[1]


def test_scores_and_selection_equal_single_process(runs, ref):
    for r in runs["two"]:  # every rank chose the same chunks from the same gathered scores
        assert r["kept_B"] == ref["kept_B"]
        _equal_terms(r["scores_B"], ref["scores_B"])
    assert len(ref["kept_A"]) == 2 and ref["kept_A"] != [0, 1]  # a real choice, not the first chunks
    assert runs["two"][0]["extra_A"]["selected_chunks"] == ref["kept_A"]


def test_tokens_equal_single_process_fresh_and_saved(runs, ref):
    two, three = runs["two"], runs["three"]
    for name in CONFIGS:
        assert torch.equal(two[0][f"tokens_{name}"], ref[f"tokens_{name}"]), name
        assert torch.equal(three[0][f"tokens_saved_{name}"], ref[f"tokens_{name}"]), name
        e, w = two[0][f"extra_{name}"], ref[f"extra_{name}"]
        for key in ("num_chunks", "selected_chunks", "all_chunk_scores", "chunk_scores", "pseudo_labels"):
            assert e[key] == w[key], (name, key)
        assert e["distributed"]["world_size"] == 2
    assert torch.equal(two[0]["tokens_saved_A"], ref["tokens_A"])
    assert all(f"tokens_{n}" not in r for r in two[1:] + three[1:] for n in CONFIGS)  # only the root decodes
    # the answer is the passkey: the tokens are not a trivial constant
    model_text = dllm.decode_text(_load(), ref["tokens_A"])[0]
    assert model_text.strip() == make_case("passkey", 900, 0.6, 3).answer


def test_other_world_size_and_a_short_chunk_alone(runs, ref):
    three = runs["three"]
    assert three[0]["bounds"] == [(0, 2), (2, 5), (5, 8)]  # the 2-rank save read on 3 ranks
    assert [r["short_width"] for r in three] == [385, 385, 132]  # rank 2 holds the 131-token chunk alone
    for r in three:  # a 1-chunk shard's scoring forward has another batch shape: equal to round-off, not bits
        for t, w in ref["scores_short"].items():
            assert (w is None) == (r["scores_short"][t] is None), t
            if w is not None:
                torch.testing.assert_close(r["scores_short"][t], w.float().cpu(), rtol=0, atol=1e-5)
    assert torch.equal(three[0]["tokens_short"], ref["tokens_short"])
    want = ref["doc_short"].chunks
    got, lens = three[0]["short_full_k0"], three[0]["short_lens"]
    assert torch.equal(lens, want.lens) and got.shape == want.k[0].shape
    for j, n in enumerate(lens.tolist()):
        assert torch.equal(got[j, :n], want.k[0][j, :n])


def test_index_file_and_its_errors(runs, ref, tmp_path):
    idx = os.path.join(runs["dir"], "doc.idx")
    index = dd.read_index(idx)
    assert index["world_size"] == 2 and index["num_chunks"] == 8 and index["num_tokens"] == 899
    assert [s["first_chunk"] for s in index["shards"]] == [0, 4]
    model = _load()
    # one process (no group) reads every shard: the whole document, equal to the single-process cache
    whole = dd.ShardedDocument.load(idx, model)
    assert whole.bounds == [(0, 8)] and whole.local.chunks.starts == ref["doc_A"].chunks.starts
    with pytest.raises(ValueError, match="not a sharded document index"):
        dd.read_index(dd.ShardedDocument.shard_path(whole, idx, 0).replace("00000-of-00001", "00000-of-00002"))
    with pytest.raises(ValueError, match="cannot be shared by 9 ranks"):
        dd.shard_bounds(8, 9)
    # a shard replaced by another encoding's shard is refused
    import json
    import shutil

    for f in os.listdir(runs["dir"]):
        if f.startswith("doc.idx"):
            shutil.copy(os.path.join(runs["dir"], f), tmp_path / f)
    bad = json.loads((tmp_path / "doc.idx").read_text())
    bad["shards"][1]["tensor_digest"] = "0" * 64
    (tmp_path / "doc.idx").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="is not the shard"):
        dd.ShardedDocument.load(tmp_path / "doc.idx", model)


def test_a_failing_rank_ends_the_group_with_one_error(runs):
    errors = [r["rank_error"] for r in runs["fails"]]
    assert errors[0] == errors[1] == errors[2]  # the same error on every rank, and the group goes on
    rank, kind, message, user = errors[0]
    assert (rank, kind, user) == (1, "ValueError", True) and "other context token ids" in message


def test_a_rank_that_dies_does_not_hang_its_peers(runs):
    assert runs["codes"] == [0, 0, 3]
    rank, _kind, message, user = runs["dies"]["rank_error"]
    assert rank == -1 and not user and "process group failed" in message
    assert runs["dies"]["seconds"] < GLOO_TIMEOUT_S / 2  # the backend saw the closed connection: no timeout


@pytest.mark.parametrize("world", [2, 3])
def test_torchrun_equals_one_process_at_the_defaults(runs, ref, world):
    """The bundled defaults snap chunk boundaries to sentence ends; 2 and 3 ranks cut the same chunks
    as one process, hold the same K/V, keep the same chunks and decode the same tokens, with the defaults and
    with a first stage (candidates) and redundancy-aware selection."""
    got = runs[f"defaults{world}"]
    want = ref["doc_defaults"].chunks
    assert ref["doc_defaults"].boundary_snap > 0 and got[0]["snap"] == ref["doc_defaults"].boundary_snap
    spans = list(zip(want.starts, want.sizes()))
    assert spans != cut_chunks(len(ref["doc_defaults"]), ref["doc_defaults"].chunk_size)  # the snap moved them
    assert [r["spans"] for r in got] == [spans] * world
    assert got[0]["bounds"] == dd.shard_bounds(len(spans), world)
    full = got[0]["full"]
    assert full["starts"] == want.starts and torch.equal(full["lens"], want.lens) and torch.equal(full["ids"], want.ids)
    for layer in range(len(want.k)):
        for g, w in ((full["k"][layer], want.k[layer]), (full["v"][layer], want.v[layer])):
            for j, n in enumerate(want.lens.tolist()):
                assert torch.equal(g[j, :n], w[j, :n]), (layer, j)
    for name in ("defaults", "staged", "all_adaptive"):
        e, w = got[0][f"extra_{name}"], ref[f"extra_{name}"]
        assert torch.equal(got[0][f"tokens_{name}"], ref[f"tokens_{name}"]), name
        for key in ("num_chunks", "selected_chunks", "all_chunk_scores", "chunk_scores", "pseudo_labels"):
            assert e[key] == w[key], (name, key)
    assert got[0]["extra_staged"]["candidate_chunks"] == ref["extra_staged"]["candidate_chunks"]
    # adaptive K at top_k None: scored and cut below N, on every rank count as in one process
    w = ref["extra_all_adaptive"]
    assert len(w["all_chunk_scores"]) == w["num_chunks"] and 1 <= len(w["selected_chunks"]) < w["num_chunks"]
    # candidates="auto": the same rule across ranks as in one (fresh, two-pass) process
    e, w = got[0]["extra_auto"], ref["extra_auto"]
    n = w["num_chunks"]
    least = auto_candidates(n, 1)  # + the two neighbours of the best and the lexical best (K=1, lexical_weight)
    assert least <= len(w["candidate_chunks"]) <= least + 3 < n
    assert e["candidate_chunks"] == w["candidate_chunks"] and e["selected_chunks"] == w["selected_chunks"]
    assert torch.equal(got[0]["tokens_auto"], ref["tokens_auto"])
    assert len(ref["extra_staged"]["candidate_chunks"]) == 9 < ref["extra_staged"]["num_chunks"]
    # the redundancy threshold changed the choice against plain top-K over the same scores
    total = torch.tensor([float("-inf") if x is None else x for x in ref["extra_staged"]["all_chunk_scores"]])
    assert ref["extra_staged"]["selected_chunks"] != sorted(torch.topk(total, 4).indices.tolist())
    assert all(f"tokens_{n}" not in r for r in got[1:] for n in ("defaults", "staged"))
    answer = dllm.decode_text(_load(), got[0]["tokens_defaults"])[0].strip()
    assert answer == make_case("passkey", 2700, 0.4, 5).answer  # the tokens are the answer, not a constant


def test_snapped_index_read_in_one_process(runs, ref):
    """The sharded index of a snapped document, read by one process (its shards re-split onto it),
    is the single-process document; one shard alone is refused, naming its index."""
    model = _load()
    idx = os.path.join(runs["dir"], "snapped3.idx")
    index = dd.read_index(idx)
    assert index["format"] == 2 and index["boundary_snap"] > 0 and index["world_size"] == 3
    whole = dd.load_document(idx, model)
    want = ref["doc_defaults"]
    assert whole.chunks.starts == want.chunks.starts and torch.equal(whole.chunks.lens, want.chunks.lens)
    assert whole.boundary_snap == want.boundary_snap
    for j, n in enumerate(want.chunks.lens.tolist()):
        assert torch.equal(whole.chunks.k[0][j, :n], want.chunks.k[0][j, :n])
    assert dd.read_document_header(idx)["num_chunks"] == want.num_chunks
    shard = shard_path(idx, 1, 3)
    for read in (lambda: dllm.DocumentCache.load(shard, model), lambda: dd.load_document(shard, model)):
        with pytest.raises(ValueError, match="one shard of a sharded document.*'snapped3.idx'"):
            read()


def test_a_share_of_snapped_chunks_is_cut_again_the_same_from_its_own_tokens():
    """Why a sharded encoding (and a shard's check on load) may snap a share alone: the greedy cut of any
    contiguous share of the whole document's chunks, run on the share's tokens only, gives the same chunks
    (3000 random cases, every tolerance below C)."""
    from dllm.prefilling.chunks import snapped_chunks

    gen = torch.Generator().manual_seed(0)
    for case in range(3000):
        c = int(torch.randint(2, 40, (1,), generator=gen))
        tol = int(torch.randint(0, c, (1,), generator=gen))
        n = int(torch.randint(1, 400, (1,), generator=gen))
        ends = torch.rand(n, generator=gen) < float(torch.rand(1, generator=gen))
        spans = snapped_chunks(ends, c, tol)
        lo = int(torch.randint(0, len(spans), (1,), generator=gen))
        hi = int(torch.randint(lo + 1, len(spans) + 1, (1,), generator=gen))
        a, b = spans[lo][0], spans[hi - 1][0] + spans[hi - 1][1]
        assert [(s + a, size) for s, size in snapped_chunks(ends[a:b], c, tol)] == spans[lo:hi], (case, c, tol)


@pytest.mark.parametrize("raw", ["abc", "inf", "0", "-5", "nan"])
def test_a_bad_dist_timeout_is_one_error_naming_the_variable(monkeypatch, raw):
    """It was a ValueError from float() or a C++ trace from the rendezvous, on every rank."""
    from dllm.distributed import group

    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("PREFILLING_DLLM_DIST_TIMEOUT", raw)
    with pytest.raises(ValueError, match=f"PREFILLING_DLLM_DIST_TIMEOUT must be a number of seconds .* got '{raw}'"):
        group.init_from_env("cpu")
    monkeypatch.setenv("PREFILLING_DLLM_DIST_TIMEOUT", " 90 ")
    assert group._timeout_from_env() == 90.0
    with pytest.raises(ValueError, match="timeout_s must be"):
        group.init_from_env("cpu", timeout_s=float("inf"))
