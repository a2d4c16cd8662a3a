"""``bash bench/gpu_check.sh OUT`` dry-runs on CPU through every stage (the plumbing a GPU run relies on is
checked before a GPU is lent), packs its outputs into at most 8 files (the GPU machine hands back no more),
its deadline skips stages instead of overrunning, and at GPU sizes every stage fits 9 minutes even when
each one uses its whole timeout."""

import csv
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import pack_outputs as P

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.sh"
STAGES = ("launch", "tests", "bench", "decode_step", "cuda_graph", "e2e", "e2e_dream")
GPU_RUN_S = 540  # one GPU run: 9 minutes
KILL_AFTER_S = 15  # timeout --kill-after of a stage

needs_bash = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash")


def _run(out: Path, work: Path, **env) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    full |= {"PYTHON": sys.executable, "DRY_RUN": "1", "WORK_DIR": str(work), **env}
    return subprocess.run(["bash", str(SCRIPT), str(out)], env=full, capture_output=True, text=True, timeout=600)


def _stage_rows(summary: str) -> dict:
    return {m[0]: (m[1], int(m[2])) for m in re.findall(r"^\| (\w+) \| ([^|]+?) \| (\d+) \|", summary, flags=re.M)}


@needs_bash
def test_dry_run_passes_every_stage_and_packs_at_most_8_files(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    res = _run(out, work)
    summary = (out / "summary.txt").read_text()
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "mode: dry run" in summary
    assert {k: v[0] for k, v in _stage_rows(summary).items()} == dict.fromkeys(STAGES, "rc=0")
    # OUT: the packed files only
    names = sorted(p.name for p in out.iterdir())
    assert len(names) <= P.MAX_FILES, names
    assert {"summary.txt", "bench_kernels_cpu.csv", "decode_step.md", "e2e_dream_shape.md"} <= set(names)
    assert list(csv.DictReader(open(out / "bench_kernels_cpu.csv")))
    assert "Skipped: dry run" in (out / "decode_step.md").read_text()  # no CUDA graph to profile in a dry run
    tests = (out / "tests.txt").read_text()
    assert "==> tests.log <==" in tests and "<testsuite" in tests
    data = (out / "data.txt").read_text()
    assert "==> e2e_prefilling_gpu.csv <==" in data and "==> e2e_dream_shape.csv <==" in data
    assert "Skipped: dry run" in (out / "reports.txt").read_text()  # cuda_graph.md, bundled
    assert "==> bench.log <==" in (out / "logs.txt").read_text()
    assert "launch_check: no CUDA device" in (out / "logs.txt").read_text()  # the launch stage ran, and said why not
    # every stage left its output in the work folder, as a GPU run's reader expects
    dream = list(csv.DictReader(open(work / "e2e_dream_shape.csv")))
    assert len(dream) == 9 and {r["shape"] for r in dream} == {"cpu"} and {r["status"] for r in dream} == {"ok"}
    assert "End to end at the small CPU (dry run) shape" in summary
    assert summary.count("| prefilling | ok |") == 3


@needs_bash
def test_deadline_skips_stages_and_fails_the_run(tmp_path):
    res = _run(tmp_path / "out", tmp_path / "work", DEADLINE_S="1")
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert res.returncode == 1
    assert {k: v[0] for k, v in _stage_rows(summary).items()} == dict.fromkeys(STAGES, "skipped")
    assert summary.count("SKIPPED") == len(STAGES)


@needs_bash
def test_gpu_sizes_fit_one_gpu_run_in_the_worst_case(tmp_path):
    """PLAN_ONLY at GPU sizes: every stage counted at its whole timeout; none is skipped, the last gets a
    useful share, and deadline + a killed stage's grace stay within 9 minutes."""
    res = _run(tmp_path / "out", tmp_path / "work", DRY_RUN="0", PLAN_ONLY="1")
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert res.returncode == 0, res.stdout[-3000:]
    rows = _stage_rows(summary)
    assert {k: v[0] for k, v in rows.items()} == dict.fromkeys(STAGES, "planned")
    deadline = int(re.search(r"deadline (\d+)s", summary).group(1))
    assert deadline + KILL_AFTER_S <= GPU_RUN_S
    assert sum(v[1] for v in rows.values()) <= deadline
    assert rows["e2e_dream"][1] >= 15 and rows["bench"][1] >= 150
    try:  # the compiled kernel tests run in parallel wherever pytest-xdist is installed (the GPU image has it)
        import xdist  # noqa: F401

        assert "tests: in parallel, pytest-xdist -n 14" in summary and " -n 14 " in summary
    except ImportError:
        assert "tests: serial (no pytest-xdist here)" in summary
    assert len(list((tmp_path / "out").iterdir())) <= P.MAX_FILES


def test_plan_pack_keeps_the_readers_files_and_bundles_the_rest():
    names = ["summary.txt", "bench_kernels_gpu.csv", "decode_step.md", "decode_step.csv", "cuda_graph.md",
             "cuda_graph.csv", "tests.log", "tests.xml", "bench.log", "e2e.log", "env.txt", "e2e_dream_shape.md",
             "e2e_dream_shape.csv", "e2e_prefilling_gpu.csv", "weird.bin"]  # fmt: skip
    plan = P.plan_pack(names)
    assert len(plan) <= P.MAX_FILES
    for kept in ("summary.txt", "bench_kernels_gpu.csv", "decode_step.md", "e2e_dream_shape.md"):
        assert plan[kept] == [kept]
    assert plan["tests.txt"] == ["tests.log", "tests.xml"]
    assert plan["logs.txt"] == ["bench.log", "e2e.log"]
    assert plan["reports.txt"] == ["cuda_graph.md", "env.txt"]
    data = {"cuda_graph.csv", "decode_step.csv", "e2e_dream_shape.csv", "e2e_prefilling_gpu.csv", "weird.bin"}
    assert set(plan["data.txt"]) == data
    assert sorted(sum(plan.values(), [])) == sorted(names)  # every file lands exactly once
    with pytest.raises(ValueError, match="> 8"):
        P.plan_pack(names, dict(keep=[f"k{i}" for i in range(6)], bundles=[("a", ["*"]), ("b", ["*"]), ("c", ["*"])]))


def test_pack_writes_headers_and_rewrites_in_place(tmp_path):
    work, out = tmp_path / "w", tmp_path / "o"
    work.mkdir()
    (work / "a.log").write_text("one")
    (work / "b.log").write_text("two\n")
    (work / "summary.txt").write_text("s\n")
    assert P.pack(work, out) == ["logs.txt", "summary.txt"]
    assert (out / "logs.txt").read_text() == "==> a.log <==\none\n==> b.log <==\ntwo\n"
    (work / "c.csv").write_text("x,y\n")
    P.pack(work, out)  # after the next stage: the same names rewritten, one more bundle
    assert sorted(p.name for p in out.iterdir()) == ["data.txt", "logs.txt", "summary.txt"]
    assert P.main([str(tmp_path / "missing"), str(out)]) == 2
