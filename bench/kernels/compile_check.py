"""AOT compile gate: every kernel launch of a GPU plan, compiled for sm_90 / sm_80 without a GPU.

The interpreter accepts programs the real compiler rejects, and it says nothing about
registers, spills or shared memory. This tool plans every case of the ``gate``
registry (``bench/kernel_cases.py``: Dream-7B and LLaDA-8B decode, scoring, joint
scoring, top-B gather, merge, and the decode step's residual add + RMSNorm, RoPE and
SwiGLU) for a fake 132-SM H200 (sm_90) or 108-SM A100 (sm_80)
(:func:`triton_kernels.plan.assume_gpu`), calls the public ops with
``backend="triton"`` on uninitialised CPU tensors, and intercepts every
``kernel[grid](...)`` launch: instead of running it, that exact specialisation (the
constexprs the plan chose, the argument types and divisibility a launch of these
tensors has) goes through ``triton.compile`` down to a cubin with the ptxas of the
Triton wheel. Per launch it reports the grid, registers, spills, shared memory, the
CTAs per SM they allow, and the MMA instructions, and checks:

* registers <= 255 and no spill stores or loads;
* shared memory within the arch's per-CTA limit (227 KB sm_90, 163 KB sm_80);
* ``wgmma`` on sm_90 wherever a ``tl.dot`` kernel has BLOCK_M >= 64;
* occupancy >= what the planner assumes (:data:`triton_kernels.plan.CTAS_PER_SM`).

    python -m bench.kernels.compile_check [--arch 90 80] [--dtype bf16 fp16] [--jobs 2]
                                  [--json FILE] [--out bench/results/compile_sm90.md]

Exit code 1 if any check fails. Every run compiles into a fresh Triton cache (the
ptxas report exists only for a real compile). Must run with TRITON_INTERPRET unset.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("compile_check: unset TRITON_INTERPRET (it makes @triton.jit build interpreter objects)")

import torch  # noqa: E402
import triton  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

from bench.kernel_cases import call, cases, make_inputs  # noqa: E402
from triton_kernels import chunk_scores, glu, merge, rms_norm, rope, skip_value_checks, split_s, topb  # noqa: E402
from triton_kernels.plan import A100, H200, assume_gpu, assumed_ctas_per_sm, ctas_per_sm  # noqa: E402

SPECS = {90: H200, 80: A100}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
KERNEL_SITES = [
    (merge, "_merge_states_kernel"),
    (split_s, "_split_s_partial_kernel"),
    (chunk_scores, "_row_lse_kernel"),
    (chunk_scores, "_column_mass_kernel"),
    (chunk_scores, "_row_mass_kernel"),
    (topb, "_select_topb_kernel"),
    (topb, "_gather_rows_kernel"),
    (rms_norm, "_add_rms_norm_kernel"),
    (rope, "_rope_qk_kernel"),
    (glu, "_swiglu_kernel"),
]
DOT_KERNELS = {"_split_s_partial_kernel", "_row_lse_kernel", "_column_mass_kernel", "_row_mass_kernel"}
PLANNED = {"_split_s_partial_kernel": "split_s", "_row_lse_kernel": "row_lse"}  # occupancy the planner assumes
SHOWN = ("BLOCK_M", "BLOCK_N", "BLOCK_D", "BLOCK_R", "BLOCK_B", "BLOCK_T", "N_UNROLL", "KEY_SPLITS", "HAS_LIVE_LENS")
SHOWN += ("BLOCK_H", "HAS_RESIDUAL", "BLOCK_HQ", "BLOCK_HK", "BLOCK_HALF", "BLOCK")


def ptxas_stats(log: str) -> dict:
    """Registers, stack frame and spill bytes from a ``ptxas -v`` report."""
    regs = re.search(r"Used (\d+) registers", log)
    frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if regs is None or frame is None:
        raise RuntimeError(f"no ptxas report in the compile log:\n{log[-2000:]}")
    stack, stores, loads = (int(x) for x in frame.groups())
    return dict(regs=int(regs.group(1)), stack=stack, spill_stores=stores, spill_loads=loads)


def mma_kind(ptx: str) -> str:
    if "wgmma.mma_async" in ptx:
        return "wgmma"
    if "mma.sync" in ptx:
        return "mma.sync"
    return "-"


class _CompileOnly:
    """Stands in for a JITFunction: ``k[grid](**kw)`` records the launch and compiles it (once per spec)."""

    def __init__(self, fn, target, state):
        self.fn, self.target, self.state = fn, target, state
        self.backend = make_backend(target)
        self.binder = create_function_from_signature(fn.signature, fn.params, self.backend)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            bound, spec, options = self.binder(*args, **kwargs)
            options, signature, constexprs, attrs = self.fn._pack_args(self.backend, kwargs, bound, spec, options)
            names = {self.fn.arg_names[k[0]]: v for k, v in constexprs.items()}
            key = (self.fn.fn.__name__, str(signature), str(sorted((str(k), str(v)) for k, v in names.items())))
            key += (options.num_warps, options.num_stages)
            variants = self.state["variants"]
            if key not in variants:
                t0 = time.time()
                buf = io.StringIO()
                with contextlib.redirect_stdout(buf):  # knobs.nvidia.dump_ptxas_log prints the report
                    compiled = triton.compile(
                        ASTSource(self.fn, signature, constexprs, attrs), target=self.target, options=options.__dict__
                    )
                ptx = compiled.asm["ptx"]
                variants[key] = dict(
                    ptxas_stats(buf.getvalue()),
                    smem=compiled.metadata.shared,
                    mma=mma_kind(ptx),
                    cp_async="cp.async" in ptx,
                    compile_s=round(time.time() - t0, 2),
                    variant=len(variants),
                )
            grid3 = tuple(grid) + (1,) * (3 - len(grid))
            self.state["rows"].append(
                dict(
                    case=self.state["case"],
                    kernel=self.fn.fn.__name__,
                    grid=list(grid3),
                    ctas=grid3[0] * grid3[1] * grid3[2],
                    num_warps=options.num_warps,
                    num_stages=options.num_stages,
                    constexprs={k: str(v) for k, v in names.items() if k in SHOWN},
                    **variants[key],
                )
            )

        return launch


@contextlib.contextmanager
def compile_only(arch: int):
    """Inside: every kernel launch of the launchers compiles for ``sm_<arch>`` instead of running."""
    target = GPUTarget("cuda", arch, 32)
    state: dict = {"variants": {}, "rows": [], "case": ""}
    saved = []
    for mod, name in KERNEL_SITES:
        saved.append((mod, name, getattr(mod, name)))
        setattr(mod, name, _CompileOnly(getattr(mod, name), target, state))
    for mod in {m for m, _ in KERNEL_SITES}:
        saved.append((mod, "require_runnable", mod.require_runnable))
        mod.require_runnable = lambda *a, **k: None  # CPU tensors are fine: nothing is launched
    try:
        yield state
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)


def check(row: dict, arch: int, dtype: torch.dtype) -> list[str]:
    """The gate's failures for one launch row (empty: it passes)."""
    spec = SPECS[arch]
    bad = []
    if row["regs"] > 255:
        bad.append(f"{row['regs']} registers > 255")
    if row["spill_stores"] or row["spill_loads"]:
        bad.append(f"spills ({row['spill_stores']} B stored, {row['spill_loads']} B loaded)")
    if row["smem"] > spec.smem_per_block:
        bad.append(f"shared memory {row['smem']} B > {spec.smem_per_block} B")
    block_m = int(row["constexprs"].get("BLOCK_M", 0))
    if arch >= 90 and row["kernel"] in DOT_KERNELS and block_m >= 64 and row["mma"] != "wgmma":
        bad.append(f"no wgmma at BLOCK_M={block_m} (got {row['mma']})")
    if row["kernel"] in PLANNED:
        block_d = int(row["constexprs"]["BLOCK_D"])
        want = assumed_ctas_per_sm(PLANNED[row["kernel"]], spec, block_m, block_d, dtype.itemsize)
        if row["ctas_per_sm"] < want:
            bad.append(f"{row['ctas_per_sm']} CTAs/SM < {want} the planner assumes")
    return bad


def run_gate(arch: int, dtype_name: str) -> list[dict]:
    """Plan, intercept and compile every launch of the gate cases for one (arch, dtype)."""
    cache = tempfile.mkdtemp(prefix="compile_check_")
    knobs.cache.dir = cache
    knobs.nvidia.dump_ptxas_log = True
    dtype = DTYPES[dtype_name]
    spec = SPECS[arch]
    try:
        with compile_only(arch) as state, assume_gpu(spec), skip_value_checks():
            for case in cases("gate"):
                state["case"] = f"{case.op}:{case.name}"
                call(case, make_inputs(case, "cpu", dtype, empty=True), backend="triton")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    for row in state["rows"]:
        row.update(arch=arch, dtype=dtype_name, gpu=spec.name)
        row["ctas_per_sm"] = ctas_per_sm(spec, row["num_warps"], row["regs"], row["smem"])
        row["failures"] = check(row, arch, dtype)
    return state["rows"]


# ----------------------------------------------------------------------------- report

COLS = ["case", "kernel", "dtype", "grid", "CTAs", "warps", "regs", "spills", "smem KB", "CTAs/SM", "MMA", "ok"]


def _cells(r: dict) -> list[str]:
    spills = r["spill_stores"] + r["spill_loads"]
    return [
        r["case"],
        r["kernel"].strip("_").replace("_kernel", ""),
        r["dtype"],
        "x".join(str(g) for g in r["grid"]),
        str(r["ctas"]),
        str(r["num_warps"]),
        str(r["regs"]),
        str(spills),
        f"{r['smem'] / 1024:.1f}",
        str(r["ctas_per_sm"]),
        r["mma"] + (" +cp.async" if r["cp_async"] else ""),
        "ok" if not r["failures"] else "FAIL: " + "; ".join(r["failures"]),
    ]


def markdown(rows: list[dict], arch: int) -> str:
    sel = [r for r in rows if r["arch"] == arch]
    lines = ["| " + " | ".join(COLS) + " |", "|" + "---|" * len(COLS)]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in sel]
    return "\n".join(lines)


def summary(rows: list[dict], arch: int) -> str:
    sel = [r for r in rows if r["arch"] == arch]
    if not sel:
        return f"sm_{arch}: nothing compiled"
    bad = sum(1 for r in sel if r["failures"])
    variants = len({(r["dtype"], r["variant"]) for r in sel})
    return (
        f"sm_{arch} ({SPECS[arch].name} plan, {SPECS[arch].sm_count} SMs): {len(sel)} launches, {variants} distinct "
        f"compiles, {bad} failing; max {max(r['regs'] for r in sel)} registers, "
        f"max {max(r['smem'] for r in sel) / 1024:.1f} KB shared memory, "
        f"{sum(r['spill_stores'] + r['spill_loads'] for r in sel)} B of spills"
    )


def write_md(path: Path, rows: list[dict]) -> None:
    """Rewrite this Triton version's section of ``path``, keeping the other versions' sections."""
    version = triton.__version__
    section = [
        f"## Triton {version}",
        "",
        f"`python -m bench.kernels.compile_check --out {path.as_posix()}` (torch {torch.__version__}).",
        "",
    ]
    for arch in sorted({r["arch"] for r in rows}, reverse=True):
        section += [f"- {summary(rows, arch)}"]
    section += [""]
    if any(r["arch"] == 90 for r in rows):
        section += ["sm_90, every launch:", "", markdown(rows, 90), ""]
    head = [
        "# AOT compile table: every kernel launch of the H200 plan, compiled for sm_90",
        "",
        "Derived figures, not timings: each launch the launchers make for the `gate` cases of",
        "`bench/kernel_cases.py` on a fake 132-SM H200 (and 108-SM A100 for sm_80) is compiled",
        "ahead of time with the ptxas of the Triton wheel (`bench/kernels/compile_check.py`). Columns: grid",
        "(query tiles x KV heads, partials, rows or the kernel's own), registers and spill bytes",
        "from `ptxas -v`, static shared memory, the CTAs per SM those allow (CUDA occupancy rule),",
        "the MMA instruction in the PTX and whether it uses `cp.async`. The gate",
        "(`tests/kernels/test_gpu_compile.py`) fails on > 255 registers, any spill, shared memory",
        "over the arch limit, a missing wgmma at BLOCK_M >= 64 on sm_90, or fewer CTAs per SM",
        "than the planner assumes.",
        "",
    ]
    sections = {}
    if path.exists():
        parts = re.split(r"^(?=## Triton )", path.read_text(), flags=re.M)
        for part in parts[1:]:
            sections[part.split("\n", 1)[0][len("## Triton ") :].strip()] = part.rstrip() + "\n"
    sections[version] = "\n".join(section).rstrip() + "\n"
    body = "\n".join(sections[v] for v in sorted(sections, key=lambda v: tuple(int(x) for x in v.split(".")[:3])))
    path.write_text("\n".join(head) + "\n" + body)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, nargs="+", default=[90, 80], choices=sorted(SPECS))
    ap.add_argument("--dtype", nargs="+", default=["bf16", "fp16"], choices=sorted(DTYPES))
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (one (arch, dtype) each)")
    ap.add_argument("--json", type=Path, help="write every launch row as JSON here")
    ap.add_argument("--out", type=Path, help="rewrite this Triton version's section of this markdown file")
    args = ap.parse_args(argv)
    t0 = time.time()
    jobs = [(a, d) for a in args.arch for d in args.dtype]
    if args.jobs > 1:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(min(args.jobs, len(jobs))) as pool:
            parts = pool.starmap(run_gate, jobs)
    else:
        parts = [run_gate(a, d) for a, d in jobs]
    rows = [r for part in parts for r in part]
    seconds = time.time() - t0
    for arch in args.arch:
        print(f"[compile_check] {summary(rows, arch)}")
    for r in rows:
        if r["failures"]:
            print(f"[compile_check] FAIL sm_{r['arch']} {r['dtype']} {r['case']} {r['kernel']}: {r['failures']}")
    print(f"[compile_check] triton {triton.__version__}: {len(rows)} launches checked in {seconds:.0f}s")
    if args.json:
        args.json.write_text(json.dumps(dict(triton=triton.__version__, seconds=seconds, rows=rows), indent=1))
    if args.out:
        write_md(args.out, rows)
        print(f"[compile_check] wrote {args.out}")
    return 1 if any(r["failures"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
