"""``bash bench/gpu_check.sh OUT`` dry-runs on CPU through every stage (issue 16: the plumbing a GPU run
relies on is checked before a GPU is lent), and its deadline skips stages instead of overrunning."""

import csv
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.sh"
STAGES = ("tests", "e2e", "e2e_dream", "cuda_graph", "bench")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash")


def _run(out: Path, **env) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    full |= {"PYTHON": sys.executable, "DRY_RUN": "1", **env}
    return subprocess.run(["bash", str(SCRIPT), str(out)], env=full, capture_output=True, text=True, timeout=600)


def _stage_rows(summary: str) -> dict:
    return {m[0]: m[1] for m in re.findall(r"^\| (\w+) \| ([^|]+?) \| \d+ \|", summary, flags=re.M)}


def test_dry_run_passes_every_stage(tmp_path):
    res = _run(tmp_path / "out")
    out = tmp_path / "out"
    summary = (out / "summary.txt").read_text()
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "mode: dry run" in summary
    assert _stage_rows(summary) == dict.fromkeys(STAGES, "rc=0")
    assert "dry_run: 1" in (out / "env.txt").read_text()
    # every stage left its output where a GPU run's reader will look for it
    assert "<testsuite" in (out / "tests.xml").read_text()
    assert list(csv.DictReader(open(out / "e2e_prefilling_gpu.csv")))
    dream = list(csv.DictReader(open(out / "e2e_dream_shape.csv")))
    assert len(dream) == 9 and {r["shape"] for r in dream} == {"cpu"} and {r["status"] for r in dream} == {"ok"}
    assert list(csv.DictReader(open(out / "bench_kernels_cpu.csv")))
    assert "Skipped: dry run" in (out / "cuda_graph.md").read_text()  # no CUDA graph to capture in a dry run
    # the one summary table at the end carries the Dream-shaped table
    assert "End to end at the small CPU (dry run) shape" in summary
    assert summary.count("| prefilling | ok |") == 3


def test_deadline_skips_stages_and_fails_the_run(tmp_path):
    res = _run(tmp_path / "out", DEADLINE_S="1")
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert res.returncode == 1
    assert _stage_rows(summary) == dict.fromkeys(STAGES, "skipped")
    assert summary.count("SKIPPED") == len(STAGES)
