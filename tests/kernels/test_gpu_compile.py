"""The kernels compile for a real GPU target (sm_90) with the installed Triton, without a GPU.

The interpreter accepts programs the compiler rejects, so on CPU-only machines
this runs ``bench/compile_check.py --quick`` in a subprocess without
TRITON_INTERPRET: every kernel specialisation the launchers produce for
fp16/D=128/G=7 goes through ``triton.compile`` down to a cubin (ptxas ships
with the Triton wheel). On a GPU the other tests compile and run the kernels.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ._helpers import ON_GPU

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(ON_GPU, reason="the GPU run compiles every kernel for real")
@pytest.mark.compat
def test_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run(
        [sys.executable, "-m", "bench.compile_check", "--quick", "--arch", "90"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr.lower():
        pytest.skip("no ptxas in this Triton install")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "kernel variants compiled for sm_90" in proc.stdout
