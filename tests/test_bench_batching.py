"""bench.batching: a small run writes its two files with every row equal to its single run; output folders."""

import csv
from pathlib import Path

import pytest

import bench.batching
from bench.outputs import RESULTS_DIR, RUNS_DIR


def test_small_batching_run_writes_equal_rows_and_phase_ratios(tmp_path):
    assert bench.batching.main(["--out", str(tmp_path), "--lengths", "1100", "1500", "1200", "--rounds", "1"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["batching.csv", "batching.md"]
    rows = list(csv.DictReader((tmp_path / "batching.csv").open()))
    requests = [r for r in rows if r["run"] == "request"]
    assert len(requests) == 3 and all(r["equal_tokens"] == "1" for r in requests)
    assert all(r["answer_single"] == r["answer_batch"] for r in requests)
    seq, bat = (next(r for r in rows if r["run"] == name) for name in ("sequential", "batch"))
    assert int(seq["steps"]) == 3 * int(bat["steps"])  # one loop for the three rows
    assert int(bat["nfe"]) < int(seq["nfe"])
    assert all(r["commit"] and r["device_name"] for r in rows)  # provenance on every row
    md = (tmp_path / "batching.md").read_text()
    for phase in ("| prefill |", "| scoring |", "| decode |"):
        assert phase in md
    assert "Each row equal to its single run: 3/3" in md and "predicted" in md


@pytest.mark.parametrize("record", [False, True])
def test_batching_writes_to_runs_unless_recording(record, monkeypatch):
    seen = []
    monkeypatch.setattr(bench.batching, "load_model", lambda *a, **k: None)
    monkeypatch.setattr(bench.batching, "run", lambda *a, **k: seen.append(a[-1]) or exit(0))
    with pytest.raises(SystemExit):
        bench.batching.main(["--record"] if record else [])
    assert Path(seen[0]) == (RESULTS_DIR if record else RUNS_DIR / "bench")
