"""bench.studies.copy_levers: settings parsed into configurations, the table counted, and a case's rows equal to
fresh prefilling runs of the same settings (decoded from a document cache)."""

from __future__ import annotations

import csv
import functools

import pytest
import torch

import dllm
from bench.fidelity.copy_eval import SEED_BASE, make_copy_case
from bench.studies.copy_levers import (
    TUNE_SEED_BASE,
    main,
    neighbour_always,
    neighbour_if_top,
    parse_setting,
    run_case,
    table,
    without_neighbour,
)
from dllm import generate
from dllm.eval.evaluation import case_inputs, response_length
from dllm.model.loader import default_model_dir
from dllm.prefilling import PrefillingConfig
from dllm.prefilling.selection import kept_chunks

pytestmark = pytest.mark.usefixtures("one_thread")


@functools.cache
def model():
    return dllm.load_model()


def test_settings_parse_into_top_k_or_adaptive_k():
    base = PrefillingConfig(chunk_size=256, top_k=4, adaptive_k=None)
    assert (parse_setting("k1", base).top_k, parse_setting("k1", base).adaptive_k) == (1, None)
    assert (parse_setting("ak1.5", base).top_k, parse_setting("ak1.5", base).adaptive_k) == (4, 1.5)
    assert parse_setting("k2", PrefillingConfig(adaptive_k=2.0)).adaptive_k is None  # a fixed K is fixed
    assert parse_setting("ak2-solo", base).adaptive_k == 2.0
    for bad in ("x", "k", "akx", "4", "k1-solo"):
        with pytest.raises(ValueError, match="expected k<N>"):
            parse_setting(bad, base)


def test_tuning_seeds_are_apart_from_the_evaluations():
    assert TUNE_SEED_BASE - SEED_BASE >= 5000  # copy_eval draws SEED_BASE + k, k < 5000


def test_neighbour_rules():
    """Scores with one chunk standing out: the library keeps it and its better neighbour when that neighbour is
    among the K best; -solo the chunk alone; -any the neighbour whatever its rank (the rule before)."""
    scores = torch.tensor([0.0, 0.1, 0.2, 9.0, 0.3, 0.0, 0.1, 0.2])
    assert kept_chunks(scores, 4, 1.5) == neighbour_if_top(scores, 4, 1.5) == neighbour_always(scores, 4, 1.5)
    assert kept_chunks(scores, 4, 1.5) == [3, 4]  # the neighbour 4 ranks 2nd of 8
    assert without_neighbour(scores, 4, 1.5) == [3]
    assert without_neighbour(scores, 4, None) == kept_chunks(scores, 4, None) == [2, 3, 4, 7]
    # the neighbours at the bottom: -any keeps one anyway, the library and -top do not
    low = torch.tensor([0.5, 0.6, 0.0, 9.0, 0.0, 0.7, 0.8, 0.9])
    assert neighbour_always(low, 4, 1.5) == [2, 3]
    assert kept_chunks(low, 4, 1.5) == neighbour_if_top(low, 4, 1.5) == [3]
    for name in ("ak1.5-top", "ak1.5-any", "ak1.5-solo"):
        assert parse_setting(name, PrefillingConfig()).adaptive_k == 1.5


def test_top_rule_is_the_librarys():
    """The study's -top rule, built from -any, keeps what the library keeps on random scores (some -inf)."""
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        n = int(torch.randint(2, 12, (1,), generator=g))
        scores = torch.randn(n, generator=g) * torch.rand(1, generator=g) * 3
        scores[int(torch.randint(0, n, (1,), generator=g))] += 6.0
        scores[torch.rand(n, generator=g) < 0.15] = float("-inf")
        if not torch.isfinite(scores).any():
            continue
        k = int(torch.randint(1, n + 1, (1,), generator=g))
        assert neighbour_if_top(scores, k, 1.5) == kept_chunks(scores, k, 1.5), (scores, k)


def test_table_counts_kept_and_exact():
    rows = [
        {"length": 4096, "setting": "k1", "kept": True, "correct": True, "chunks_kept": 1},
        {"length": 4096, "setting": "k1", "kept": False, "correct": False, "chunks_kept": 1},
        {"length": 4096, "setting": "k4", "kept": True, "correct": False, "chunks_kept": 4},
        {"length": 4096, "setting": "k4", "kept": True, "correct": True, "chunks_kept": 4},
    ]
    lines = table(rows, ["k1", "k4"]).splitlines()
    assert "| 4096 | k1 | 2 | 1 | 1/1 | 1/2 | 1.00 |" in lines
    assert "| 4096 | k4 | 2 | 2 | 1/2 | 1/2 | 4.00 |" in lines
    assert "| all | k4 | 2 | 2 | 1/2 | 1/2 | 4.00 |" in lines


def test_rows_equal_fresh_runs():
    """Each setting's answer from the one document cache is the answer of a fresh prefilling run."""
    tiny_model = model()
    base = PrefillingConfig.from_pretrained(default_model_dir())
    case = make_copy_case("devil", "passkey", 2048, 0.5, TUNE_SEED_BASE)
    settings = {"k4": parse_setting("k4", base), "k1": parse_setting("k1", base)}
    rows = run_case(tiny_model, case, settings, base)
    assert [r["chunks_kept"] for r in rows] == [4, 1]
    solo = run_case(tiny_model, case, {"ak1.5-solo": parse_setting("ak1.5-solo", base)}, base)[0]
    assert 1 <= solo["chunks_kept"] <= 4
    g = response_length(case)
    for row, cfg in zip(rows, settings.values()):
        fresh = generate(tiny_model, **case_inputs(tiny_model, case, "prefilling"), method="prefilling",
                         prefilling=cfg, gen_length=g, steps=g)  # fmt: skip
        assert row["answer"] == fresh.text[0]
        kept = fresh.stats.extra["selected_chunk_tokens"]
        assert row["chunks_kept"] == len(kept)


def test_cli_writes_the_table(tmp_path):
    assert main(["--lengths", "1024", "--cases", "1", "--settings", "k2", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader(open(tmp_path / "copy_levers.csv")))
    assert [(r["setting"], r["chunks_kept"]) for r in rows] == [("k2", "2")]
    assert "| 1024 | k2 | 1 |" in (tmp_path / "copy_levers.md").read_text()


def test_cli_refuses_a_bad_setting(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--settings", "q3", "--cases", "1"])
    assert e.value.code == 2
    assert "expected k<N>" in capsys.readouterr().err
