"""bench.speed.batching: a small run writes its two files with every row equal to its single run; output folders."""

import csv
import re
from pathlib import Path

import pytest

import bench.speed.batching
from bench.outputs import RESULTS_DIR, RUNS_DIR


def test_small_batching_run_writes_equal_rows_and_phase_ratios(tmp_path):
    argv = ["--out", str(tmp_path), "--lengths", "1100", "1500", "1200", "--rounds", "1"]
    assert bench.speed.batching.main(argv) == 0
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
    monkeypatch.setattr(bench.speed.batching, "load_model", lambda *a, **k: None)
    monkeypatch.setattr(bench.speed.batching, "run", lambda *a, **k: seen.append(a[-1]) or exit(0))
    with pytest.raises(SystemExit):
        bench.speed.batching.main(["--record"] if record else [])
    assert Path(seen[0]) == (RESULTS_DIR if record else RUNS_DIR / "bench")


def test_decode_cpu_mode_reports_phase_attention_and_bound(tmp_path):
    """--decode-cpu: the denoising phase alone in CPU time, split-S apart; numbers positive, parts add up,
    every row equal to its single run, and the bound line (batch attention against half the single runs)."""
    import torch

    n_threads = torch.get_num_threads()
    try:
        args = ["--decode-cpu", "--out", str(tmp_path), "--lengths", "1100", "1500", "--rounds", "1"]
        assert bench.speed.batching.main(args) == 0
    finally:
        torch.set_num_threads(n_threads)
    md = (tmp_path / "batching_decode_cpu.md").read_text()
    assert "(1 thread)" in md and "Rows equal to their single runs: 2/2." in md
    table = {}
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4 and cells[0] in ("whole phase", "split-S attention"):
            table[cells[0]] = (float(cells[1]), float(cells[2]), float(cells[3].rstrip("x")))
    (s, b, ratio), (sa, ba, _) = table["whole phase"], table["split-S attention"]
    # The ratio comes from unrounded times and is printed to 2 decimals; the times are printed to 3: their rounding
    # (half a unit in the last digit each) bounds how far the ratio may sit from s / b.
    rounding = (s / b) * (0.0005 / s + 0.0005 / b) + 0.005
    assert 0 < sa < s and 0 < ba < b and ratio == pytest.approx(s / b, abs=rounding + 1e-9)
    # The bound is computed from unrounded times: compare it with the table's rounded ones to the last digit.
    bound = re.search(r"at or under ([0-9.]+) s; its split-S attention alone takes ([0-9.]+) s", md)
    assert bound, md
    assert float(bound[1]) == pytest.approx(s / 2, abs=0.0011) and float(bound[2]) == pytest.approx(ba, abs=0.0011)
