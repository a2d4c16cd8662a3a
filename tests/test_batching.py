"""Batched ragged requests: ``generate(method="prefilling", prompt=[PromptParts, ...])`` runs one
denoising loop for all rows, and every row equals the same request decoded alone (greedy).

The reference of each row is its own single run (``prompt=PromptParts``), the path the golden cases
pin down; rows differ in prefix, context and query length and in chunk count, so the live blocks are
padded (``live_lens``) and the segment table has empty slots.
"""

import pytest
import torch

import dllm
from dllm.decode.timer import PhaseTimer
from dllm.prefilling import PrefillingConfig, PromptParts, build_prefilling_policy
from tests.tiny_checkpoints import LLADA_BOS, tiny_model_fixtures

BOS = 128  # DREAM_TINY bos_token_id


dream, llada = tiny_model_fixtures(dream_seed=31, llada_seed=32, llada_kv_heads=3)


# (prefix, context, query) lengths: chunk counts 6, 3, 9, 1 and 6 at C = 8; the empty prefix leaves a
# row with one segment fewer; the last row shares the first row's prefix and context (asks another query).
SHAPES = [(6, 45, 6), (4, 21, 9), (6, 70, 3), (0, 5, 12)]


def _rows(bos=BOS, vocab=120, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda n: torch.randint(0, vocab, (n,), generator=g)
    rows = []
    for n_pre, n_ctx, n_q in SHAPES:
        prefix = torch.cat([torch.tensor([bos]), r(n_pre - 1)]) if n_pre else torch.zeros(0, dtype=torch.long)
        rows.append(PromptParts(prefix, r(n_ctx), r(n_q)))
    rows.append(PromptParts(rows[0].prefix, rows[0].context, r(7)))
    return rows


BATCH_WIDE = ("gen_tokens", "block_cache", "block_cache_refreshes", "block_cache_bytes")  # the whole run's, not a row's


def _single_extra(res):
    return {k: v for k, v in res.stats.extra.items() if k not in BATCH_WIDE}


def _assert_rows_equal_single_runs(model, rows, kw, documents=None, contexts=None):
    batch = dllm.generate(model, method="prefilling", prompt=rows, document=documents, **kw)
    assert batch.tokens.shape == (len(rows), kw["gen_length"])
    assert batch.stats.extra["batch_size"] == len(rows) and len(batch.stats.rows) == len(rows)
    for i, parts in enumerate(rows):
        if contexts is not None and contexts[i] is not None:
            parts = PromptParts(parts.prefix, contexts[i], parts.query)
        alone = dllm.generate(model, method="prefilling", prompt=parts, **kw)
        assert torch.equal(batch.tokens[i], alone.tokens[0]), f"row {i}"
        row = dict(batch.stats.rows[i])
        assert row.pop("steps") == alone.stats.steps and row.pop("gen_tokens") == kw["gen_length"]
        row.pop("document", None)  # the fresh single run has no document
        assert row == _single_extra(alone), f"row {i}"  # kept chunks, every score, cached tokens
    assert (batch.tokens != model.mask_token_id).all()
    return batch


# Greedy rules of both families, both cache modes, with and without a token budget (each mode once with B).
CASES = [
    ("dream", "maskgit_plus", "independent", None),
    ("dream", "topk_margin", "independent", 3),
    ("dream", "entropy", "joint", None),
    ("dream", "confidence_threshold", "joint", 3),
    ("llada", "low_confidence", "independent", 3),
    ("llada", "low_confidence", "joint", None),
]


@pytest.mark.parametrize(("family", "alg", "mode", "budget"), CASES)
def test_each_ragged_row_equals_its_single_run(family, alg, mode, budget, dream, llada):
    model = dream if family == "dream" else llada
    rows = _rows(BOS, 120) if family == "dream" else _rows(LLADA_BOS, 90)
    cfg = PrefillingConfig(chunk_size=8, top_k=1, token_budget=budget, cache_mode=mode, pool_kernel=3)
    kw = dict(prefilling=cfg, alg=alg, gen_length=8, steps=8, block_length=4, threshold=0.05)
    _assert_rows_equal_single_runs(model, rows, kw)


@pytest.mark.parametrize("score_mode", ["dllm", "causal"])
def test_rows_keep_their_own_chunks_with_top_k_and_chunk_batches(dream, score_mode):
    """K = 3 of 3..9 chunks, prefill and scoring in batches of 4 chunks that straddle rows; causal scoring
    batches only rows of equal live length."""
    rows = [r for r in _rows() if r.context.numel() >= 17]
    cfg = PrefillingConfig(chunk_size=8, top_k=3, score_mode=score_mode, prefill_batch=4)
    batch = _assert_rows_equal_single_runs(dream, rows, dict(prefilling=cfg, gen_length=6, steps=6))
    assert len({tuple(r["selected_chunks"]) for r in batch.stats.rows}) > 1  # rows chose differently


def test_batch_answers_from_documents(dream, tmp_path):
    """One document for every row, and a list of documents with a row that brings its own context."""
    rows = _rows()
    cfg = PrefillingConfig(chunk_size=8, top_k=2, token_budget=3, pool_kernel=3)
    kw = dict(prefilling=cfg, gen_length=8, steps=8)
    doc = dllm.encode_document(dream, rows[0].context, prefilling=cfg)
    doc.save(tmp_path / "a.cache")
    doc = dllm.DocumentCache.load(tmp_path / "a.cache", dream)
    questions = [PromptParts(rows[0].prefix, None, r.query) for r in rows]
    batch = _assert_rows_equal_single_runs(dream, questions, kw, documents=doc, contexts=[rows[0].context] * len(rows))
    assert all(r["document"] is True for r in batch.stats.rows)
    doc2 = dllm.encode_document(dream, rows[2].context, prefilling=cfg)
    mixed = [questions[0], rows[1], PromptParts(rows[2].prefix, None, rows[2].query)]
    batch = _assert_rows_equal_single_runs(
        dream, mixed, kw, documents=[doc, None, doc2], contexts=[rows[0].context, None, rows[2].context]
    )
    assert [r.get("document", False) for r in batch.stats.rows] == [True, False, True]


def test_one_forward_per_step_for_all_rows_and_stacked_chunks(dream):
    """The chunks of all rows are encoded in one forward [sum N, C+1]; identical prefixes and drafts are
    encoded once; every denoising step is one forward over the padded live block [B, max L_q + L_d]."""
    rows = _rows()
    cfg = PrefillingConfig(chunk_size=8, top_k=1)
    seen = []
    hook = dream.register_forward_pre_hook(lambda m, a, k: seen.append(tuple(a[0].shape)), with_kwargs=True)
    try:
        batch = dllm.generate(dream, method="prefilling", prompt=rows, prefilling=cfg, gen_length=4, steps=4)
    finally:
        hook.remove()
    n_chunks = [-(-r.context.numel() // 8) for r in rows]
    assert seen[0] == (sum(n_chunks) - n_chunks[3], 9)  # every row of >= C context tokens: T = C + 1
    assert seen[1] == (n_chunks[3], 6)  # the 5-token context: T = 6
    assert seen[-4:] == [(5, 12 + 4)] * 4  # 4 steps over the padded live block
    n_prefixes = 3  # rows 0 and 4 share a prefix, row 3 has none
    n_drafts = 3  # the one-chunk row needs no scoring; the others' prefix + query lengths are 12, 13, 9, 13
    assert (
        batch.stats.nfe == 2 + n_prefixes + n_drafts + 2 + 4
    )  # chunks (2 T groups), prefixes, drafts, 2 passes, steps
    assert batch.stats.steps == 4 and [r["steps"] for r in batch.stats.rows] == [4] * 5


def test_batched_policy_logits_equal_each_row_alone(dream):
    """On an all-mask and a half-filled response, row b of the batched step equals the single policy."""
    rows = _rows()
    cfg = PrefillingConfig(chunk_size=8, top_k=1, token_budget=4, pool_kernel=3)
    timer = PhaseTimer("cpu")
    batched = build_prefilling_policy(dream, None, rows, cfg, timer, gen_length=6).policy
    assert batched.live.live_lens.tolist() == [r.query.numel() + 6 for r in rows]
    resp = torch.full((len(rows), 6), dream.mask_token_id)
    half = torch.where(torch.arange(6) % 2 == 0, resp, torch.arange(6) + 3)
    for r in (resp, half):
        got = batched.logits(r)
        for b, parts in enumerate(rows):
            one = build_prefilling_policy(dream, None, parts, cfg, timer, gen_length=6)
            want = one.policy.logits(r[b : b + 1])[0]
            assert (got[b] - want).abs().max().item() < 1e-5


def test_padded_forward_equals_unpadded_rows(dream):
    """DiffusionLM.forward with live_lens: padded rows give each row's own logits, with and without a cache."""
    g = torch.Generator().manual_seed(3)
    lens = [7, 4, 10]
    ids = torch.randint(0, 120, (3, 10), generator=g)
    pos = torch.arange(10) + torch.tensor([[20], [3], [0]])
    live_lens = torch.tensor(lens, dtype=torch.int32)
    from dllm.model.kv_cache import Segment

    segs = []
    with torch.no_grad():
        for n in (5, 9, 2):
            out = dream(torch.randint(0, 120, (1, n), generator=g), torch.arange(n), logits_start=n, return_kv=True)
            segs.append([Segment([k[0] for k in out.k], [v[0] for v in out.v], n)])
        for cache in (None, dllm.StaticKVCache.from_rows(segs)):
            both = dream(ids, pos, cache, live_lens=live_lens).logits
            for b, n in enumerate(lens):
                row_cache = None if cache is None else dllm.StaticKVCache.from_rows([segs[b]])
                alone = dream(ids[b : b + 1, :n], pos[b : b + 1, :n], row_cache).logits[0]
                assert (both[b, :n] - alone).abs().max().item() < 1e-5
        with pytest.raises(ValueError, match="live_lens must be in \\[0, L=10\\]"):
            dream(ids, pos, live_lens=torch.tensor([7, 4, 11]))
        with pytest.raises(ValueError, match="live_lens cannot be combined"):
            dream(ids, pos, live_lens=live_lens, attention_mask=torch.ones(3, 10, dtype=torch.bool))


def test_texts_of_a_batch_on_the_bundled_model():
    """out.text[i] is row i's answer (bundled tiny model, two passkey prompts of different lengths)."""
    from bench.fidelity.demo import TINY_PREFILLING
    from dllm.eval.evaluation import case_inputs
    from dllm.eval.tasks import make_case

    model = dllm.load_model(device="cpu")
    cases = [make_case("passkey", n, 0.5, 7 + i, tokenizer=None) for i, n in enumerate((1200, 2100))]
    rows = [case_inputs(model, c, "prefilling")["prompt"] for c in cases]
    kw = dict(method="prefilling", prefilling=TINY_PREFILLING, gen_length=8, steps=8)
    batch = dllm.generate(model, prompt=rows, **kw)
    for i, parts in enumerate(rows):
        alone = dllm.generate(model, prompt=parts, **kw)
        assert batch.text[i] == alone.text[0] and torch.equal(batch.tokens[i], alone.tokens[0])
    assert len(batch.text) == 2


def test_bad_batches(dream):
    rows = _rows()
    gen = lambda prompt, **kw: dllm.generate(
        dream,
        method="prefilling",
        prompt=prompt,
        prefilling=PrefillingConfig(chunk_size=8, top_k=1),
        gen_length=4,
        **kw,
    )
    with pytest.raises(ValueError, match="empty list"):
        gen([])
    bad = PromptParts(rows[1].prefix, rows[1].context, torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match=r"prompt\[1\]: prompt.query is empty"):
        gen([rows[0], bad])
    doc = dllm.encode_document(dream, rows[0].context, chunk_size=8)
    with pytest.raises(ValueError, match="2 entries for 3 prompts"):
        gen([PromptParts(rows[0].prefix, None, rows[0].query)] * 3, document=[doc, doc])
    with pytest.raises(TypeError, match="pass prompt= as a list"):
        gen(rows[0], document=[doc])
    with pytest.raises(TypeError, match=r"document\[1\] must be a DocumentCache"):
        gen(rows[:2], document=[None, "doc.cache"])
    with pytest.raises(ValueError, match=r"prompt\[0\]: pass the context either"):
        gen(rows[:2], document=doc)


def test_per_row_forward_counts_of_a_shared_prefill(dream):
    """Rows of 6, 3, 9 and 6 chunks stacked and encoded 3 chunks per forward: [0,6) [6,9) [9,18) [18,24);
    each row counts the forwards its chunks took part in, plus its prefix (rows 0 and 3 share theirs)."""
    rows = [r for r in _rows() if r.context.numel() >= 17]
    cfg = PrefillingConfig(chunk_size=8, top_k=3, prefill_batch=3)
    timer = PhaseTimer("cpu")
    setup = build_prefilling_policy(dream, None, rows, cfg, timer, gen_length=4)
    assert [r.prefill.chunks.num_chunks for r in setup.rows] == [6, 3, 9, 6]
    assert [r.prefill.nfe for r in setup.rows] == [2 + 1, 1 + 1, 3 + 1, 2 + 1]
    assert setup.rows[0].prefill.prefix is setup.rows[3].prefill.prefix  # one segment for the shared prefix
    alone = [build_prefilling_policy(dream, None, r, cfg, timer, gen_length=4) for r in rows]
    assert [a.prefill.nfe for a in alone] == [2 + 1, 1 + 1, 3 + 1, 2 + 1]  # the same counts as alone
    # the batch: 8 chunk forwards and 3 distinct prefixes (the rows' counts sum to 12); the 3-chunk row keeps
    # all (K = 3) and is not scored, the others' 6 + 9 + 6 chunks make 7 scoring batches of 3, 2 passes each
    n_draft = 3  # prefix + query lengths 12, 9, 13 (one forward each)
    assert setup.policy.nfe == 8 + 3 + n_draft + 7 * 2
    assert setup.rows[1].selection.scores is None and setup.rows[1].selection.kept == [0, 1, 2]
