"""The multi-part evaluation (bench/fidelity/multipart_eval.py): its grid, answer lengths, tables and one run."""

import csv

import pytest

from bench.fidelity import multipart_eval as me
from dllm.eval.tasks.multipart import make_multipart


def test_grid_turns_the_part_counts_and_answers_fit_whole_blocks():
    assert me.grid(4096, 7) == [(2, me.SEED_BASE), (3, me.SEED_BASE), (4, me.SEED_BASE), (2, me.SEED_BASE + 1),
                                (3, me.SEED_BASE + 1), (4, me.SEED_BASE + 1), (2, me.SEED_BASE + 2)]  # fmt: skip
    # 32 characters a part ("The pass key number 1 is 12345.") and a space between: 65 + 6 -> 96, 98 + 6 -> 128,
    # 131 + 6 -> 160
    assert [me.gen_length(make_multipart(4096, n, 1)) for n in (2, 3, 4)] == [96, 128, 160]
    assert [me.gen_length(make_multipart(4096, n, 1), 100) for n in (2, 3, 4)] == [128, 128, 160]
    assert me.gen_length(make_multipart(4096, 2, 1), 256) == 256


def test_part_chunks_are_the_chunks_each_needle_overlaps():
    case = make_multipart(4096, 2, 3)
    (s0, e0), (s1, e1) = case.spans
    spans = [(0, s0 + 2), (s0 + 2, e0 + 5), (e0 + 5, s1), (s1, len(case.context))]
    assert me.part_chunks(spans, case) == [[0, 1], [3]]


def _row(length, parts, off, on, crop, kept_off, kept_on, s=1.0):
    return {"length": length, "parts": parts, "off_right": off, "on_right": on, "crop_right": crop,
            "off_all": off == parts, "on_all": on == parts, "crop_all": crop == parts,
            "off_parts_kept": kept_off, "on_parts_kept": kept_on, "off_s": s, "on_s": 2 * s}  # fmt: skip


def test_tables_count_parts_and_whole_answers():
    rows = [_row(4096, 2, 2, 2, 1, 1, 2), _row(4096, 4, 1, 3, 4, 2, 4), _row(16384, 3, 0, 3, 3, 3, 3, s=3.0)]
    by_length = me.table(rows, "length").splitlines()
    assert by_length[2] == ("| 4096 | 2 | 6 | 50% (3/6) / 83% (5/6) / 83% (5/6) | 50% (1/2) / 50% (1/2) / 50% (1/2) "
                            "| 50% (3/6) / 100% (6/6) | 1.00 / 2.00 |")  # fmt: skip
    assert by_length[3].startswith("| 16384 | 1 | 3 | 0% (0/3) / 100% (3/3) / 100% (3/3) | 0% (0/1) / 100% (1/1)")
    by_parts = me.table(rows, "parts").splitlines()
    assert [line.split(" | ")[0] for line in by_parts[2:]] == ["| 2", "| 3", "| 4"]
    # read back from a CSV, booleans are text
    text_rows = [{k: str(v) for k, v in r.items()} for r in rows]
    assert me.table(text_rows, "length") == me.table(rows, "length")


def test_one_case_runs_end_to_end_and_is_written(tmp_path):
    out = tmp_path / "mp"
    assert me.main(["--lengths", "1024", "--cases", "1", "--out", str(out)]) == 0
    (row,) = list(csv.DictReader(open(out / "multipart_eval.csv")))
    case = make_multipart(1024, 2, me.SEED_BASE)
    assert row["gold"] == case.answer and row["gen_length"] == "96" and row["parts"] == "2"
    assert int(row["crop_chars"]) <= me.CROP + 1 and row["commit"]
    for m in ("off", "on", "crop"):
        assert 0 <= int(row[f"{m}_right"]) <= 2
    assert "| 1024 | 1 | 2 |" in (out / "multipart_eval.md").read_text()


@pytest.mark.parametrize("flag", ["--cases", "--crop", "--threads"])
def test_counts_below_one_are_a_usage_error(flag, capsys):
    with pytest.raises(SystemExit) as e:
        me.main([flag, "0"])
    assert e.value.code == 2 and f"{flag} must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        me.main(["--gen-length", "-1"])
    assert e.value.code == 2 and "--gen-length must be 0" in capsys.readouterr().err
