"""AOT compile gate: every kernel launch of the H200 / A100 plans compiles for sm_90 / sm_80 within the limits.

The interpreter accepts programs the compiler rejects and says nothing about registers,
spills or shared memory, so on CPU-only machines this runs ``bench/kernels/compile_check.py`` in a
subprocess without TRITON_INTERPRET: the launchers plan every ``gate`` case of
``bench/kernel_cases.py`` (Dream-7B and LLaDA-8B decode, ragged batch, scoring batch of 16,
joint scoring N=1 T=4096, top-B gather, merge; the decode step's add + RMSNorm, RoPE,
SwiGLU) for a fake 132-SM sm_90 and 108-SM sm_80
device, in bf16 and fp16, and each launch is compiled to a cubin by the ptxas of the Triton
wheel. ``make test-compat`` (Triton 3.6.0, the GPU machines' version) compiles for both arches; ``make test``
(the newest Triton) for sm_90 only, the arch of the H100 / H200 the project is lent, which halves its 100 s
on a 2-core machine. ``COMPILE_GATE_ARCHS="90 80"`` picks the arches by hand.
On a GPU the other tests compile and run the kernels for that machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.kernel_cases import cases
from triton_kernels.plan import A100, H200

from ._helpers import KERNELS, ON_GPU

ROOT = Path(__file__).resolve().parents[2]
ARCHS = [int(a) for a in os.environ.get("COMPILE_GATE_ARCHS", "90").split()]
assert ARCHS and set(ARCHS) <= {90, 80}, f"COMPILE_GATE_ARCHS: one or both of 90 80, got {ARCHS}"

DOT_KERNELS = {"_split_s_partial_kernel", "_row_lse_kernel", "_column_mass_kernel", "_row_mass_kernel"}


@pytest.fixture(scope="module")
def gate(tmp_path_factory):
    out = tmp_path_factory.mktemp("gate") / "gate.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "bench.kernels.compile_check", "--arch", *map(str, ARCHS), "--jobs", "2"]
        + ["--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr.lower():
        pytest.skip("no ptxas in this Triton install")
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    print(f"compile gate: {len(data['rows'])} launches on triton {data['triton']} in {data['seconds']:.0f} s")
    return proc, data["rows"]


pytestmark = [pytest.mark.compat, pytest.mark.skipif(ON_GPU, reason="the GPU run compiles every kernel for real")]


def _row(rows, arch, dtype, case, kernel):
    sel = [r for r in rows if (r["arch"], r["dtype"], r["case"], r["kernel"]) == (arch, dtype, case, kernel)]
    assert sel, (arch, dtype, case, kernel)
    return sel[0]


def test_every_launch_passes(gate):
    proc, rows = gate
    failing = [(r["arch"], r["dtype"], r["case"], r["kernel"], r["failures"]) for r in rows if r["failures"]]
    assert not failing, failing
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    limits = {90: H200.smem_per_block, 80: A100.smem_per_block}
    for r in rows:
        where = (r["arch"], r["dtype"], r["case"], r["kernel"])
        assert r["regs"] <= 255 and r["spill_stores"] == 0 and r["spill_loads"] == 0, where
        assert r["smem"] <= limits[r["arch"]], where
        if r["arch"] == 90 and r["kernel"] in DOT_KERNELS and int(r["constexprs"]["BLOCK_M"]) >= 64:
            assert r["mma"] == "wgmma", where


def test_gate_covers_every_kernel_case_arch_and_dtype(gate):
    _, rows = gate
    assert {r["kernel"] for r in rows} == KERNELS
    assert {(r["arch"], r["dtype"]) for r in rows} == {(a, d) for a in ARCHS for d in ("bf16", "fp16")}
    assert {r["case"] for r in rows} == {f"{c.op}:{c.name}" for c in cases("gate")}
    ragged = [r for r in rows if r["kernel"] == "_split_s_partial_kernel" and "ragged" in r["case"]]
    assert ragged and all(r["constexprs"]["HAS_LIVE_LENS"] == "True" for r in ragged)


@pytest.mark.skipif(90 not in ARCHS, reason="COMPILE_GATE_ARCHS leaves sm_90 out")
def test_gate_compiled_the_h200_plans(gate):
    """The specialisations compiled are those of the 132-SM plan (not the CPU branch)."""
    _, rows = gate
    dream = "split_s_attention:dream7b/b1-k4-c1024-m64"
    assert _row(rows, 90, "bf16", dream, "_split_s_partial_kernel")["grid"] == [28, 8, 1]
    assert _row(rows, 90, "bf16", dream, "_merge_states_kernel")["ctas"] >= H200.sm_count
    joint = "chunk_attention_scores:dream7b/n1-t4096-m64"
    assert _row(rows, 90, "bf16", joint, "_row_lse_kernel")["ctas"] >= H200.sm_count
    if 80 in ARCHS:
        assert _row(rows, 80, "bf16", dream, "_merge_states_kernel")["ctas"] >= A100.sm_count
