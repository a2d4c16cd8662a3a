"""The README's code blocks run as written.

Every ```python block runs in a fresh interpreter, and every ```bash block runs under
``bash -e``, in an empty working directory (so they may only use files they create
themselves). Blocks that need a GPU, a real checkpoint or many minutes are skipped by
name (``make``, ``gpu_check.sh``, a ``/path/to/`` placeholder), and the test says so.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
# What a block may hold only where it is not meant to run here: a long job, a GPU, a user's checkpoint.
NOT_HERE = ("make ", "gpu_check.sh", "/path/to/")


def blocks(lang: str) -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return [body for kind, body in FENCE.findall(text) if kind == lang]


def runnable(lang: str) -> list:
    out = []
    for i, body in enumerate(blocks(lang)):
        skip = next((m for m in NOT_HERE if m in body), None)
        marks = [pytest.mark.skip(reason=f"needs what {skip.strip()!r} implies (not run in CI)")] if skip else []
        out.append(pytest.param(body, id=f"{lang}{i}", marks=marks))
    return out


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.pop("TRITON_INTERPRET", None)  # the README's user runs the ordinary CPU path
    return env


def test_readme_has_code_to_run():
    assert blocks("python"), "the README lost its Python example"
    assert blocks("bash"), "the README lost its command-line examples"


@pytest.mark.parametrize("body", runnable("python"))
def test_python_block_runs(body, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", body], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


@pytest.mark.parametrize("body", runnable("bash"))
def test_bash_block_runs(body, tmp_path):
    # `python` in the README means the venv's interpreter (the README says to activate it).
    proc = subprocess.run(
        ["bash", "-e", "-c", body], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    # what a README command writes goes under runs/ (git-ignored), never into the user's checkout
    assert {p.name for p in tmp_path.iterdir()} <= {"runs"}, sorted(p.name for p in tmp_path.iterdir())
