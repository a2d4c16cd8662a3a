"""The lexical chunk-score term: dllm.prefilling.lexical against a plain-Python n-gram count,
PrefillingConfig.lexical_weight, and the fusion that ranks a needle chunk first where the predictive score alone
does not."""

import json
import math
from dataclasses import replace

import pytest
import torch

from dllm.prefilling import PrefillingConfig
from dllm.prefilling.lexical import fuse_scores, lexical_scores, padded_chunks, zscore
from dllm.prefilling.pipeline import with_lexical_candidates


def reference(query: list, chunks: list, n: int, idf: bool) -> list:
    """The score written out on Python lists: sets of n-grams (the whole query when shorter than n), BM25's idf
    ``log(1 + (N - df + 0.5) / (df + 0.5))`` over the chunks, the weighted share of the query's grams found."""
    n = min(n, len(query))
    grams = {tuple(query[i : i + n]) for i in range(len(query) - n + 1)}
    sets = [{tuple(c[i : i + n]) for i in range(len(c) - n + 1)} for c in chunks]
    w = {}
    for g in grams:
        df = sum(g in s for s in sets)
        w[g] = math.log(1 + (len(chunks) - df + 0.5) / (df + 0.5)) if idf else 1.0
    total = sum(w.values())
    return [sum(w[g] for g in grams if g in s) / total for s in sets]


def _scores(query, chunks, n, idf=True, pad=7):
    """lexical_scores on ``chunks`` padded with ``pad`` (a token of the query: padding must not count)."""
    ids, lens = padded_chunks([torch.tensor(c, dtype=torch.long) for c in chunks])
    ids[ids == 0] = pad  # padded_chunks pads with 0; every chunk below uses tokens >= 1
    for j, c in enumerate(chunks):
        ids[j, len(c) :] = pad
    return lexical_scores(torch.tensor(query), ids, lens, n, idf=idf)


@pytest.mark.parametrize("idf", [False, True])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_matches_a_plain_python_count_on_random_chunks(n, idf):
    g = torch.Generator().manual_seed(n)
    for _ in range(20):
        query = torch.randint(1, 6, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist()
        chunks = [
            torch.randint(1, 8, (int(torch.randint(0, 12, (1,), generator=g)),), generator=g).tolist()
            for _ in range(int(torch.randint(1, 7, (1,), generator=g)))
        ]
        got = _scores(query, chunks, n, idf, pad=query[0])
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, torch.tensor(reference(query, chunks, n, idf)), atol=1e-6, rtol=0)


def test_hand_made_chunks_ties_and_a_query_longer_than_a_chunk():
    q = [1, 2, 3, 4]  # bigrams 12, 23, 34
    chunks = [[9, 1, 2, 3, 4, 9], [3, 4], [3, 4], [1, 2], [9, 9, 9, 9, 9]]
    plain = _scores(q, chunks, 2, idf=False).tolist()
    assert plain == pytest.approx([1.0, 1 / 3, 1 / 3, 1 / 3, 0.0])
    # idf: "12" is in 2 chunks, "34" in 3: the chunk with "12" outranks the equal pair with "34"
    s = _scores(q, chunks, 2)
    assert s[1] == s[2] and s[3] > s[1] > 0 == s[4] and s[0] == pytest.approx(1.0)
    # a query longer than every chunk (n-grams of 3 > the 2-token chunks): those chunks hold none
    assert _scores([3, 4, 5], [[3, 4], [1, 3, 4, 5]], 3, idf=False).tolist() == [0.0, 1.0]
    # a query shorter than n is one gram, the whole query
    assert _scores([3, 4], [[1, 3, 4], [4, 3]], 4, idf=False).tolist() == [1.0, 0.0]


def test_padding_and_tokens_past_lens_are_never_read():
    q = [5, 6, 7]
    ids = torch.tensor([[1, 2, 5, 6, 7], [5, 6, 1, 1, 1]])
    short = lexical_scores(torch.tensor(q), ids, torch.tensor([2, 5]), 2, idf=False)
    assert short.tolist() == pytest.approx([0.0, 0.5])  # row 0's "5 6 7" lies past its length 2
    assert lexical_scores(torch.tensor(q), ids, torch.tensor([0, 0]), 1).tolist() == [0.0, 0.0]


def test_bad_inputs():
    ids, lens = torch.ones(2, 4, dtype=torch.long), torch.tensor([4, 4])
    with pytest.raises(ValueError, match="non-empty"):
        lexical_scores(torch.tensor([], dtype=torch.long), ids, lens, 2)
    with pytest.raises(ValueError, match="integer"):
        lexical_scores(torch.tensor([1.0]), ids, lens, 2)
    with pytest.raises(ValueError, match="n must"):
        lexical_scores(torch.tensor([1]), ids, lens, 0)
    with pytest.raises(ValueError, match="lens"):
        lexical_scores(torch.tensor([1]), ids, torch.tensor([4, 5]), 1)
    with pytest.raises(ValueError, match="lens"):
        lexical_scores(torch.tensor([1]), ids, torch.tensor([4]), 1)
    with pytest.raises(ValueError, match="too many"):
        lexical_scores(torch.arange(1000), ids, lens, 7)


def test_fusion_is_a_z_scored_sum_and_keeps_unscored_chunks_out():
    pred = torch.tensor([1.0, 2.0, float("-inf"), 4.0])
    lex = torch.tensor([0.9, 0.0, 1.0, 0.3])
    got = fuse_scores(pred, lex, 0.5)
    p, x = torch.tensor([1.0, 2.0, 4.0]), torch.tensor([0.9, 0.0, 0.3])
    want = (p - p.mean()) / p.std(unbiased=False) + 0.5 * (x - x.mean()) / x.std(unbiased=False)
    torch.testing.assert_close(got[[0, 1, 3]], want)
    assert got[2] == float("-inf")
    assert zscore(torch.ones(3)).tolist() == [0.0, 0.0, 0.0]  # no spread: no contribution, no NaN
    with pytest.raises(ValueError, match="weight"):
        fuse_scores(pred, lex, -1.0)


def test_lexical_top_chunks_join_the_first_stage_candidates():
    lex = torch.tensor([0.0, 0.9, 0.1, 0.8, 0.0])
    assert with_lexical_candidates([0, 4], lex, 2) == [0, 1, 3, 4]
    assert with_lexical_candidates([0, 4], None, 2) == [0, 4]


def test_config_field_is_validated(tmp_path):
    assert PrefillingConfig().lexical_weight == 0.0
    assert PrefillingConfig(lexical_weight=2).lexical_weight == 2.0
    # 3.4e38 overflowed the fused score to inf; the ceiling is 1e6
    assert PrefillingConfig(lexical_weight=1e6).lexical_weight == 1e6
    for bad in (-1.0, float("nan"), float("inf"), True, "1", None, 10**400, 3.4e38, 1.1e6):
        with pytest.raises(ValueError, match="lexical_weight"):
            PrefillingConfig(lexical_weight=bad)
    (tmp_path / "prefilling_config.json").write_text(json.dumps({"lexical_weight": -1}))
    with pytest.raises(ValueError, match="prefilling_config.json.*lexical_weight"):
        PrefillingConfig.from_pretrained(str(tmp_path))


def test_fusion_ranks_the_needle_chunk_first_where_the_predictive_score_does_not(monkeypatch):
    """The bundled model on a pass-key case, its predictive score replaced by a
    stub that ranks the needle chunk second (a distractor first): K=1 keeps the distractor, and with
    lexical_weight=1 the needle chunk, which holds the query's words "pass key"."""
    from dllm import load_model
    from dllm.eval.evaluation import case_inputs
    from dllm.eval.tasks import make_case
    from dllm.prefilling import pipeline
    from dllm.prefilling.lexical import lexical_ngram

    model = load_model()
    assert lexical_ngram(model) == 4  # the bundled tokenizer is character-level: 4-grams
    case = make_case("passkey", 800, 0.5, 3)
    parts = case_inputs(model, case, "prefilling")["prompt"]
    stub = {}

    def stub_scores(model, rows, **kw):  # the predictive score, stubbed: no scoring forward
        from dllm.prefilling.scoring import ChunkScores

        return [ChunkScores(None, None, None, stub["total"].clone()) for _ in rows], 0

    monkeypatch.setattr(pipeline, "score_chunks_rows", stub_scores)
    cfg = PrefillingConfig.from_pretrained(model.model_dir, chunk_size=96, top_k=1)
    pre = pipeline.prefill(model, parts, cfg)
    spans = list(zip(pre.chunks.starts, pre.chunks.sizes()))
    needle = [j for j, (s, n) in enumerate(spans) if s <= case.needle_start and case.needle_end <= s + n]
    assert len(needle) == 1 and needle[0] != len(spans) - 1, spans
    total = torch.linspace(0.0, 1.0, len(spans))  # at chance: a distractor (the last chunk) first
    total[needle[0]], total[-1] = 0.95, 1.0
    stub["total"] = total
    kept = {w: pipeline.score_and_select(model, parts, pre.chunks, replace(cfg, lexical_weight=w)).kept for w in (0, 1)}
    assert kept[0] == [len(spans) - 1]
    assert kept[1] == needle


def test_cli_and_harness_pass_the_weight_and_refuse_a_negative_one(capsys, tmp_path):
    from dllm.cli import build_parser, main
    from dllm.cli.options import prefilling_config
    from dllm.harness.args import ModelArgsError, parse_model_args
    from dllm.model.loader import default_model_dir

    (tmp_path / "p.txt").write_text("Question: q")
    argv = ["generate", "--prompt-file", str(tmp_path / "p.txt"), "--method", "prefilling", "--lexical-weight"]
    args = build_parser().parse_args([*argv, "2"])
    assert prefilling_config(args, default_model_dir()).lexical_weight == 2.0
    assert main([*argv, "-1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "--lexical-weight" in err and "Traceback" not in err
    assert parse_model_args({"method": "prefilling", "lexical_weight": 0.5}).prefilling.lexical_weight == 0.5
    with pytest.raises(ModelArgsError, match="lexical_weight"):
        parse_model_args({"method": "prefilling", "lexical_weight": -1})


class _Tok:
    """A tokenizer stub: token i decodes to ``texts[i]``; id 0 is special."""

    all_special_ids = [0]

    def __init__(self, texts):
        self.texts = texts

    def __len__(self):
        return len(self.texts)

    def batch_decode(self, ids, clean_up_tokenization_spaces=False):
        return [self.texts[i[0]] for i in ids]


@pytest.mark.parametrize(
    "texts, n",
    [
        (["<|begin|>", "a", "b", "c", " ", "."], 4),  # character-level (the special token is not counted)
        (["<s>", " the", " pass", " key", "word", " Devil", "ing"], 1),  # BPE words and pieces, median 4-5
        (["<s>", "ab", " c", "de", "fg"], 2),  # two characters a token
        (None, 1),  # no tokenizer: token unigrams
    ],
)
def test_ngram_size_follows_the_characters_per_token(texts, n):
    from types import SimpleNamespace

    from dllm.prefilling.lexical import lexical_ngram

    tok = None if texts is None else _Tok(texts)
    model = SimpleNamespace(tokenizer=tok, config=SimpleNamespace(vocab_size=len(texts or [])))
    assert lexical_ngram(model) == n and model._dllm_lexical_ngram == n
