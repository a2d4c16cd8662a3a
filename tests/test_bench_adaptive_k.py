"""bench.studies.adaptive_k: the K rules applied to stored scores, the choice on tuning documents,
and other seeds for those documents. Expected values are worked by hand from the scores."""

import argparse
import json

import pytest
import torch

from bench.fidelity.heldout_eval import reports
from bench.studies.adaptive_k import band_k, choose, evaluate, kept_by, main, parse_override, parse_rule

INF = float("-inf")


def test_seed_offset_gives_other_documents_of_the_same_grid():
    a = reports([4096], seeds=1, multi_from=65536)
    b = reports([4096], seeds=1, multi_from=65536, seed_offset=100)
    assert [(d.needles[0].task, d.needles[0].depth) for d in a] == [(d.needles[0].task, d.needles[0].depth) for d in b]
    assert all(x.context != y.context for x, y in zip(a, b))
    assert [d.context for d in a] == [d.context for d in reports([4096], seeds=1, multi_from=65536)]


def test_band_keeps_the_chunks_within_m_spreads_of_the_best():
    # finite scores 0,0,1,1,2,10 (-inf left out): median 1 (lower middle), |s - 1| = 1,1,0,0,1,9 -> MAD 1
    s = torch.tensor([0.0, 0.0, 1.0, 1.0, 2.0, 10.0, INF])
    assert band_k(s, 1, 8, 1.0) == 1  # only 10 is >= 10 - 1.48
    assert band_k(s, 1, 8, 6.0) == 2  # 10 - 8.90 = 1.10: 10 and 2
    assert band_k(s, 1, 8, 7.0) == 6  # 10 - 10.38 < 0: every finite chunk
    assert band_k(s, 1, 4, 7.0) == 4  # the ceiling
    assert band_k(s, 2, 8, 1.0) == 2  # the floor


def test_band_ceiling_and_no_spread():
    s = torch.tensor([3.0, 3.0, 3.0, 3.0])  # MAD 0: every chunk ties the best
    assert band_k(s, 1, 2, 1.0) == 2
    assert band_k(torch.tensor([INF, INF]), 1, 4, 1.0) == 1


def test_kept_by_fixed_drop_band():
    s = torch.tensor([0.0, 9.0, 1.0, 8.5, INF, 2.0])
    assert kept_by(("fixed", 2), s) == [1, 3]
    assert kept_by(("fixed", 9), s) == [1, 3, 5, 2, 0]  # K past the finite chunks: all of them
    # finite 0, 9, 1, 8.5, 2: median 2, |s - 2| = 2, 7, 1, 6.5, 0 -> MAD 2, spread 2.97; drops 0.5, 6.5, 1, 1
    # the first drop >= 2.97 is after the 2nd; below the ceiling the best chunk's better neighbour joins (2: 1.0 > 0.0)
    assert kept_by(("drop", 1.0, 4), s) == [1, 2, 3]
    assert kept_by(("drop", 3.0, 4), s) == [1, 2, 3, 5]  # no drop >= 8.9: the ceiling, no neighbour added
    assert kept_by(("band", 1.0, 4), s) == [1, 3]  # 9 - 2.97 = 6.03: 9 and 8.5


def _row(scores, needle, sizes=None, decoded=None):
    row = {"scores": scores, "needle_chunks": needle, "sizes": sizes or [10] * len(scores)}
    if decoded is not None:
        row["decoded"] = decoded
    return row


def test_evaluate_counts_kept_needles_tokens_and_decoded_answers():
    rows = [
        _row([5.0, 1.0, 0.0, None], [0], decoded={"fixed K=1": {"answer": "x", "correct": True}}),
        _row(
            [0.0, 1.0, 5.0, 4.9], [3], sizes=[10, 20, 30, 40], decoded={"fixed K=1": {"answer": "", "correct": False}}
        ),
    ]
    res = evaluate(rows, [("fixed", 1), ("fixed", 2)])
    assert res[("fixed", 1)] == (1, (10 + 30) / 2, 1.0, 1)
    assert res[("fixed", 2)] == (2, (10 + 10 + 30 + 40) / 2, 2.0, None)  # not decoded


def test_choose_matches_the_best_fixed_k_with_fewest_tokens():
    res = {
        ("fixed", 1): (5, 100.0, 1.0, None),
        ("fixed", 4): (8, 400.0, 4.0, None),
        ("fixed", 8): (8, 800.0, 8.0, None),
        ("drop", 1.0, 8): (7, 150.0, 1.5, None),  # fewer needles than K=4: out
        ("drop", 2.0, 8): (8, 300.0, 3.0, None),
        ("band", 2.0, 8): (8, 300.0, 3.0, None),  # ties drop m=2 ...
        ("band", 3.0, 4): (8, 300.0, 3.0, None),  # ... and the larger margin wins the tie
    }
    assert choose(res) == (("fixed", 4), ("band", 3.0, 4))


def test_parse_override():
    assert parse_override("draft_tokens=8") == ("draft_tokens", 8)
    assert parse_override('score_terms=["self_info"]') == ("score_terms", ["self_info"])
    for bad in ("draft_tokens", "draft_tokens=eight"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_override(bad)


def test_parse_rule():
    assert parse_rule("fixed:4") == ("fixed", 4)
    assert parse_rule("drop:1.5:8") == ("drop", 1.5, 8)
    with pytest.raises(argparse.ArgumentTypeError):
        parse_rule("drop:1.5")


def test_rules_command_writes_the_tables(tmp_path):
    rows = [_row([5.0, 1.0, 0.0], [0]), _row([0.0, 1.0, 5.0], [1])]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["rules", "--tune", str(path), "--test", str(path), "--ceiling", "2", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "adaptive_k.md").read_text()
    assert "| fixed K=2 **(best fixed K on tuning)** | 2/2 (100%) | 20 | 2.00 | not decoded |" in text


def test_rules_command_user_errors_are_one_line_exit_2(tmp_path, capsys):
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    bad_rows = {
        "list": "[]",
        "no scores": '{"a": 1}',
        "no finite score": '{"scores": [null], "sizes": [1], "needle_chunks": []}',
        "needle out of range": '{"scores": [1.0], "sizes": [1], "needle_chunks": [3]}',
    }
    cases = [(str(tmp_path / "missing.jsonl"), "error: cannot read the stored scores"), (str(empty), "error: --tune")]
    for name, line in bad_rows.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text(line + "\n")
        cases.append((str(path), "error: cannot read the stored scores: " + str(path) + ":1: not a scored question"))
    for tune, message in cases:
        with pytest.raises(SystemExit) as e:
            main(["rules", "--tune", tune, "--test", tune, "--out", str(tmp_path)])
        assert e.value.code == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert last.startswith("python -m bench.studies.adaptive_k: " + message), last


def test_bench_cli_user_errors(tmp_path, capsys):
    """Tracebacks that are now argparse errors (exit 2): a ceiling below 1, a ceiling past the collected
    top_k, --set of an unknown field or of top_k."""
    path = tmp_path / "c4.jsonl"
    path.write_text(json.dumps({**_row([1.0, 0.0], [0]), "ceiling": 4}) + "\n")
    argvs = {
        "--ceiling": ["rules", "--tune", str(path), "--test", str(path), "--out", str(tmp_path), "--ceiling", "0"],
        "exceeds the top_k 4": ["rules", "--tune", str(path), "--test", str(path), "--out", str(tmp_path)],
        "--set: ": ["collect", "--out", str(tmp_path), "--set", "bogus=1"],
        "--set cannot change top_k": ["collect", "--out", str(tmp_path), "--set", "top_k=3"],
    }
    for message, argv in argvs.items():
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and message in capsys.readouterr().err.strip().splitlines()[-1], message


def test_lexical_weight_bench_margin_or_off():
    from bench.studies.lexical_weight import margin_or_off

    assert margin_or_off("0") == 0.0 and margin_or_off("1.5") == 1.5
    for bad in ("-1", "nan", "inf", "abc"):
        with pytest.raises(argparse.ArgumentTypeError):
            margin_or_off(bad)
