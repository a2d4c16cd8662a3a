"""bench.tiny.multipart_probe: phase 13's own samples decoded, scored part by part."""

import csv
import re

import pytest

from bench.tiny import multipart_probe as mp
from dllm.eval.tasks.multipart import answer_text


def test_probe_row_and_page_score_each_part_under_its_number(tmp_path):
    assert mp.main(["--cases", "2", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader(open(tmp_path / "multipart_probe.csv")))
    assert [int(r["seed"]) for r in rows] == [mp.SEED_BASE, mp.SEED_BASE + 1]
    for r in rows:
        keys = re.findall(r"\d{5}", r["gold"])
        assert 2 <= len(keys) == int(r["parts"]) <= 4 and r["gold"] == answer_text(keys)
        # independent scoring: the digits right after the first "number i is" must be the key
        firsts = [re.search(rf"number {i + 1} is (\d+)", r["answer"], re.IGNORECASE) for i in range(len(keys))]
        right = sum(bool(m) and m[1] == k for m, k in zip(firsts, keys))
        assert int(r["right"]) == right and (r["all"] == "True") == (right == len(keys))
        assert r["device_name"] and r["commit"]
    md = (tmp_path / "multipart_probe.md").read_text()
    parts, right = sum(int(r["parts"]) for r in rows), sum(int(r["right"]) for r in rows)
    assert f"Parts right: **{right}/{parts}**" in md
    assert "Command: `python -m bench.tiny.multipart_probe --cases 2" in md


def test_probe_rejects_no_cases(capsys):
    with pytest.raises(SystemExit) as e:
        mp.main(["--cases", "0"])
    assert e.value.code == 2 and "error: --cases must be at least 1" in capsys.readouterr().err
