"""Demo and benchmark outputs: runs/ by default, bench/results/ only on --record; warm-up and provenance."""

import csv
import shutil
import subprocess
from pathlib import Path

import pytest

import bench.fidelity.demo
from bench.outputs import REPO_ROOT, RESULTS_DIR, RUNS_DIR
from bench.warmup import WARMUP_SEED, first_case_line, first_case_ratios
from dllm.prefilling import PrefillingConfig

PROVENANCE = ("device_name", "device_kind", "torch", "triton", "commit", "date_utc")


def is_training_log(path: Path) -> bool:
    """The training log of bench.tiny.train (and of the H200 training probes): headerless step rows appended
    across resumed runs, read by column index (bench.tiny.model_card.plot_loss), kept beside the checkpoint's
    records under a name with 'loss' in it; not a results table."""
    if "loss" not in path.stem:
        return False
    with path.open() as f:
        return f.readline().split(",", 1)[0].strip().isdigit()


def test_every_recorded_csv_carries_its_provenance():
    logs = [p for p in RESULTS_DIR.rglob("*.csv") if is_training_log(p)]
    assert RESULTS_DIR / "tiny-train" / "loss.csv" in logs
    paths = sorted(set(RESULTS_DIR.rglob("*.csv")) - set(logs))
    assert len(paths) >= 7
    for path in paths:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
        assert rows, path
        for key in PROVENANCE:
            assert key in rows[0], f"{path.name} lacks {key}"
            assert all(r[key] for r in rows), f"{path.name}: empty {key}"


@pytest.fixture()
def demo_out_dir(monkeypatch):
    seen = []
    monkeypatch.setattr(bench.fidelity.demo, "run_demo", lambda out_dir, **kw: seen.append((out_dir, kw)) or 0)
    return seen


def test_demo_writes_to_runs_unless_recording(demo_out_dir, tmp_path):
    assert bench.fidelity.demo.main([]) == 0
    assert bench.fidelity.demo.main(["--record"]) == 0
    assert bench.fidelity.demo.main(["--out", str(tmp_path)]) == 0
    (default, kw), (recorded, kw_rec), (chosen, _) = demo_out_dir
    assert Path(default) == RUNS_DIR / "demo" and Path(recorded) == RESULTS_DIR / "demo"
    assert Path(chosen) == tmp_path
    assert kw["command"] == "python -m bench.fidelity.demo"
    assert kw_rec["command"] == "python -m bench.fidelity.demo --record"
    with pytest.raises(SystemExit):
        bench.fidelity.demo.main(["--record", "--out", str(tmp_path)])  # one or the other


def test_demo_lengths_and_methods_choose_the_grid(demo_out_dir, capsys):
    assert bench.fidelity.demo.main(["--lengths", "32768", "--methods", "prefilling"]) == 0
    assert bench.fidelity.demo.main([]) == 0
    (_out, kw), (_out2, kw_all) = demo_out_dir
    assert kw["lengths"] == (32768,) and kw["methods"] == ("prefilling",)
    assert kw["command"] == "python -m bench.fidelity.demo --lengths 32768 --methods prefilling"
    assert kw_all["lengths"] == bench.fidelity.demo.LENGTHS and kw_all["methods"] == bench.fidelity.demo.METHODS
    for bad in (["--lengths", "0"], ["--methods", "fast"]):
        with pytest.raises(SystemExit) as e:
            bench.fidelity.demo.main(bad)
        assert e.value.code == 2 and "error:" in capsys.readouterr().err


def test_run_demo_refuses_an_unknown_method_before_loading_the_model(tmp_path):
    with pytest.raises(ValueError, match="methods"):
        bench.fidelity.demo.run_demo(str(tmp_path), methods=("fast",))
    with pytest.raises(ValueError, match="methods"):
        bench.fidelity.demo.run_demo(str(tmp_path), methods=())


class _Stop(Exception):
    pass


def _stop(*args, **kwargs):
    raise _Stop(args, kwargs)


@pytest.mark.parametrize("module", ["speed.e2e_speed", "fidelity.lost_in_middle", "studies.chunk_tradeoff", "run_all"])
@pytest.mark.parametrize("record", [False, True])
def test_benchmarks_write_to_runs_unless_recording(module, record, monkeypatch):
    import importlib

    import torch

    mod = importlib.import_module(f"bench.{module}")
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr("os.makedirs", lambda *a, **k: None)
    monkeypatch.setattr(Path, "mkdir", lambda *a, **k: None)
    argv = ["--record"] if record else []
    if module == "run_all":  # it hands its folder to each study
        monkeypatch.setattr(mod.e2e_speed, "main", _stop)
        argv += ["--only", "e2e_speed"]
    else:
        monkeypatch.setattr(mod, "run", _stop)
    with pytest.raises(_Stop) as stop:
        mod.main(argv)
    args, _ = stop.value.args
    out = args[0][args[0].index("--out") + 1] if module == "run_all" else args[-1]
    assert Path(out) == (RESULTS_DIR if record else RUNS_DIR / "bench")


@pytest.mark.skipif(shutil.which("git") is None or not (REPO_ROOT / ".git").exists(), reason="not a git checkout")
def test_runs_is_ignored_and_results_are_not():
    def ignored(rel):
        return subprocess.run(["git", "check-ignore", "-q", rel], cwd=REPO_ROOT).returncode == 0

    assert ignored("runs/demo/demo.csv") and ignored("runs/bench/SUMMARY.md") and ignored("runs/eval_passkey_dense.csv")
    assert not ignored("bench/results/demo/demo.csv")


def test_first_case_ratio_by_hand():
    rows = [
        {"method": "a", "length": 1, "seconds": 3.0},
        {"method": "b", "length": 1, "seconds": 5.0},  # a row of one case: no ratio
        {"method": "a", "length": 1, "seconds": 1.0},
        {"method": "a", "length": 1, "seconds": 2.0},
        {"method": "a", "length": 2, "seconds": 4.0},
        {"method": "a", "length": 2, "seconds": 4.0},
    ]
    ratios = first_case_ratios(rows)
    assert ratios == {("a", 1): 1.5, ("a", 2): 1.0}  # 3 over the median 2; 4 over 4
    assert first_case_line(ratios) == "First case / row median: 1.00-1.50x (highest: a @ 1)."


def test_small_demo_warms_up_and_writes_only_its_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "demo"
    cfg = PrefillingConfig(chunk_size=64, top_k=2, score_terms=("draft_contrast",))
    assert bench.fidelity.demo.run_demo(str(out), lengths=(300,), depths=(0.0, 1.0), prefilling=cfg, budget_s=300) == 0
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == [
        "demo.csv",
        "demo.md",
        "demo.png",
        "demo_recall.md",
    ]
    rows = list(csv.DictReader((out / "demo.csv").open()))
    assert len(rows) == 2 * 3 and {r["seed"] for r in rows} == {"0", "1"}  # the warm-up case is not a row
    assert str(WARMUP_SEED) not in {r["seed"] for r in rows}
    md = (out / "demo.md").read_text()
    assert "Start-up, not in the table: model load" in md and "per method: prefilling" in md
    assert "First case / row median:" in md


def test_run_all_writes_long_context_where_bench_results_keeps_it(monkeypatch, tmp_path):
    """make bench's long-context study: filler beside the other reports, essays in long_context_essays/
    (the layout of bench/results), lengths shrunk by --scale."""
    import bench.run_all as run_all

    calls = []
    monkeypatch.setattr(run_all.torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(run_all.long_context, "main", lambda argv: calls.append(argv) or 0)
    assert run_all.main(["--out", str(tmp_path), "--only", "long_context", "--scale", "0.25"]) == 0
    got = [
        (a[a.index("--haystack") + 1], Path(a[a.index("--out") + 1]), a[a.index("--lengths") + 1 : -2]) for a in calls
    ]
    lengths = ["2048", "4096", "8192", "32768"]  # 4K, 16K, 32K, 128K x 0.25, at least 2048
    assert got == [("filler", tmp_path, lengths), ("essays", tmp_path / "long_context_essays", lengths)]


def test_a_reports_command_can_be_pasted_back(tmp_path, capsys):
    """write_report: the command line quotes what a shell would split, and drops this checkout's own path."""
    import shlex

    from bench.outputs import write_report

    argv = ["--out", str(tmp_path / "a dir"), "--model", f"{REPO_ROOT}/dllm/assets/tiny-dream", "--lengths", "8"]
    text = write_report(tmp_path / "r.md", "Title", "bench.study", argv, "cpu", 3.2, ["para one", "para two"])
    command = text.splitlines()[2]
    assert command.startswith("Command: `") and command.endswith("`  ")
    words = shlex.split(command[len("Command: `") : -len("`  ")])
    assert words == ["python", "-m", "bench.study", "--out", str(tmp_path / "a dir")] + [
        "--model",
        "dllm/assets/tiny-dream",
        "--lengths",
        "8",
    ]
    assert text.splitlines()[3].startswith("Machine: ") and text.endswith("para one\n\npara two")
    assert (tmp_path / "r.md").read_text() == text + "\n" and text in capsys.readouterr().out
