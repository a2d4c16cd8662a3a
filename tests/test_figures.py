"""The recorded figures redrawn from their CSVs: a title, labelled axes with units, context ticks as 4K (not
2^12), every point the time budget skipped marked; recorded CSVs hold one line per row."""

import csv
import shutil

import pytest

import bench.fidelity.demo
import bench.fidelity.lost_in_middle
import bench.speed.e2e_speed
import bench.studies.chunk_tradeoff
from bench.figures import redraw
from bench.outputs import RESULTS_DIR
from bench.plotting import read_csv_rows, tokens_label
from bench.provenance import write_csv as bench_write_csv
from dllm.eval.evaluation import EvalRow, one_line_cell, write_csv

pytest.importorskip("matplotlib")

REDRAWN = ("e2e_speed.csv", "demo/demo.csv", "chunk_tradeoff.csv", "lost_in_middle.csv")


def test_tokens_label():
    assert [tokens_label(n) for n in (300, 1024, 4096, 65536, 1 << 20, 1536)] == [
        "300",
        "1K",
        "4K",
        "64K",
        "1M",
        "1536",
    ]


@pytest.fixture()
def captured(monkeypatch):
    """The figures the plot functions would save: (figure, title, caption), not written."""
    figs = []

    def keep(fig, path, title=None, dpi=120, caption=None):
        figs.append((fig, title, caption))

    for module in (
        bench.speed.e2e_speed,
        bench.fidelity.demo,
        bench.studies.chunk_tradeoff,
        bench.fidelity.lost_in_middle,
    ):
        monkeypatch.setattr(module, "save_figure", keep)
    return figs


def _not_run_markers(ax) -> int:
    """Points drawn as an x on the axis (the legend's key is a line of x markers without data)."""
    return sum(len(line.get_xdata()) for line in ax.get_lines() if line.get_marker() == "x")


def _check_axes(fig):
    for ax in fig.axes:
        assert ax.get_xlabel() and ax.get_ylabel(), "unlabelled axis"
        assert "(" in ax.get_xlabel() and "(" in ax.get_ylabel(), f"no unit: {ax.get_xlabel()!r} {ax.get_ylabel()!r}"
        assert not any("^" in t.get_text() or "$" in t.get_text() for t in ax.get_xticklabels()), "2^12-style ticks"


def test_e2e_speed_figure(captured):
    rows = read_csv_rows(RESULTS_DIR / "e2e_speed.csv")
    bench.speed.e2e_speed.plot(rows, "unused.png")
    ((fig, title, caption),) = captured
    assert title and "one dense forward" in caption and "not run" in caption
    _check_axes(fig)
    skipped = {(r["method"], r["length"]) for r in rows if r["status"] != "ok"}
    assert len(skipped) == 3  # dense @ 32K and 64K, prefix_cache @ 64K (the recorded run)
    for ax in fig.axes:
        assert _not_run_markers(ax) == len(skipped)
        assert [t.get_text() for t in ax.get_xticklabels()] == ["2K", "4K", "8K", "16K", "32K", "64K"]


def test_demo_figure(captured):
    rows = read_csv_rows(RESULTS_DIR / "demo" / "demo.csv")
    bench.fidelity.demo.plot_demo(rows, "unused.png", bench.fidelity.demo.LENGTHS)
    ((fig, title, _),) = captured
    assert title
    _check_axes(fig)
    ran = {(r["method"], r["length"]) for r in rows}
    missing = [(m, ln) for m in bench.fidelity.demo.METHODS for ln in bench.fidelity.demo.LENGTHS if (m, ln) not in ran]
    assert missing and all(m == "dense" for m, _ in missing)  # the time budget skips dense at the longest
    for ax in fig.axes:
        assert _not_run_markers(ax) == len(missing)  # one x per skipped point
        assert [t.get_text() for t in ax.get_xticklabels()] == ["4K", "8K", "16K", "32K"]


def test_chunk_tradeoff_figure_draws_the_task_the_model_can_do(captured):
    rows = read_csv_rows(RESULTS_DIR / "chunk_tradeoff.csv")
    d = bench.studies.chunk_tradeoff.DEFAULTS
    bench.studies.chunk_tradeoff.plot(rows, d["chunk_sizes"], d["top_k"], d["lengths"], "unused.png")
    ((fig, title, caption),) = captured
    needle = [r for r in rows if r["task"] == "needle"]  # the caption counts them from the same rows
    assert needle and "passkey" in title
    assert f"needle: {sum(r['correct'] for r in needle)} of {len(needle)} cases correct" in caption
    _check_axes(fig)
    # the accuracy panel of 8K context: C=64, K=1 is the passkey mean of its 3 cases, not diluted by needle
    sel = [r for r in rows if (r["task"], r["length"], r["chunk_size"], r["top_k"]) == ("passkey", 8192, 64, 1)]
    acc = fig.axes[0].get_lines()[0].get_ydata()[0]
    assert len(sel) == 3 and acc == pytest.approx(100 * sum(r["correct"] for r in sel) / 3)
    cells = {(r["length"], r["chunk_size"], r["top_k"]) for r in rows if r["task"] == "passkey"}
    grid = [(ln, c, k) for ln in d["lengths"] for c in d["chunk_sizes"] for k in d["top_k"]]
    missing_32k = sum((32768, c, k) not in cells for c in d["chunk_sizes"] for k in d["top_k"])
    # the recorded grid is whole at 8K; at 32K the time budget skipped the largest C (and K) only
    assert 0 < missing_32k == len(grid) - len(cells)
    assert _not_run_markers(fig.axes[1]) == missing_32k and _not_run_markers(fig.axes[0]) == 0


def test_redraw_writes_every_figure_from_the_csvs(tmp_path):
    for name in REDRAWN:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(RESULTS_DIR / name, tmp_path / name)
    written = redraw(str(tmp_path))
    assert sorted(written) == sorted(str(tmp_path / n.replace(".csv", ".png")) for n in REDRAWN)
    assert all((tmp_path / n.replace(".csv", ".png")).stat().st_size > 10_000 for n in REDRAWN)


@pytest.mark.parametrize("name", REDRAWN)
def test_recorded_csv_rows_are_one_line_each(name):
    path = RESULTS_DIR / name
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    assert len(path.read_bytes().splitlines()) == len(rows)


def test_csv_writers_keep_multi_line_answers_on_one_line(tmp_path):
    assert one_line_cell("a\\b\r\nc") == "a\\\\b\\r\\nc" and one_line_cell(3) == 3
    bench_write_csv(tmp_path / "b.csv", [{"answer": "1\n2\r\n3"}, {"answer": "4"}], "cpu")
    lines = (tmp_path / "b.csv").read_bytes().splitlines()
    assert len(lines) == 3 and [r["answer"] for r in csv.DictReader((tmp_path / "b.csv").open())] == [
        "1\\n2\\r\\n3",
        "4",
    ]
    row = EvalRow("passkey", 10, 0.5, "dense", 0, False, "\n\n", "123", 0.1, 1, 10)
    write_csv([row, row], str(tmp_path / "e.csv"))
    assert len((tmp_path / "e.csv").read_bytes().splitlines()) == 3
    assert next(csv.DictReader((tmp_path / "e.csv").open()))["answer"] == "\\n\\n"
