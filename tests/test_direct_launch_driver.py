"""The direct launch path hands the CUDA driver exactly what ``kernel[grid]`` hands it, kernel by kernel.

``triton_kernels._launch`` skips ``JITFunction.run`` after a specialisation's first launch and calls the compiled
kernel's launcher itself. Its correctness is a property of what reaches ``cuLaunchKernelEx``, which needs no GPU
to observe: :mod:`tests.fake_cuda_driver` runs Triton's real CUDA launcher against a recording stand-in for
libcuda, with the kernels compiled to sm_90 cubins. Each op is called once on small CPU tensors (planned for an
H200) to capture the launches it makes, the argument tuples built the way the op builds them; every one is then
launched through ``kernel[grid]`` (the reference), through ``_launch.launch`` twice (the first takes
``kernel[grid]``, the second the direct path) and through a ``PreparedLaunch`` twice, and the recorded driver
calls must be identical: grid, block, shared memory, stream, function, launch attributes and the bytes of every
kernel parameter. Other tests show the comparison tells a wrong stream, grid or pointer apart.

The module runs in a process of its own, the interpreter off (:func:`tests.fake_cuda_driver.run_clean` says
why): in the suite, :func:`test_direct_launch_checks_in_a_clean_process` starts it and every other test here
is skipped; in that process, the others run.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from pathlib import Path

import pytest
import torch

import triton_kernels as tk
from tests.fake_cuda_driver import WORKER, fake_cuda_driver, missing_toolchain, run_clean
from tests.kernels._helpers import KERNELS  # every kernel the ops launch; the check below keeps it complete
from triton_kernels import _launch, _validate
from triton_kernels.plan import H200, assume_gpu

pytestmark = pytest.mark.usefixtures("one_thread")

HQ, HKV, D = 4, 2, 64  # small heads: the kernels specialise on D, not on the head counts


def _f(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape).to(dtype)


def _i32(x):
    return torch.as_tensor(x, dtype=torch.int32)


def _split_s(ragged: bool):
    b, k, c, m = (2, 2, 32, 16) if ragged else (1, 2, 32, 16)
    return lambda: tk.split_s_attention(
        _f(b, m, HQ, D), _f(b * k, c, HKV, D), _f(b * k, c, HKV, D),
        _i32(torch.arange(b * k).view(b, k)), _i32(torch.full((b, k), c)),
        _f(b, m, HKV, D), _f(b, m, HKV, D),
        live_lens=_i32([m, m // 2]) if ragged else None, backend="triton",
    )  # fmt: skip


# One call per op (two for split-S: with and without live lengths), each on its own fresh tensors.
OPS = {
    "split_s_attention": _split_s(False),
    "split_s_attention ragged": _split_s(True),
    "merge_states": lambda: tk.merge_states(_f(4, 16, HQ, D), torch.randn(4, 16, HQ), backend="triton"),
    "chunk_attention_scores": lambda: tk.chunk_attention_scores(
        _f(2, 16, HQ, D), _f(2, 64, HKV, D), _i32([64, 40]), _f(2, 16, HKV, D), backend="triton"
    ),
    "chunk_row_mass": lambda: tk.chunk_row_mass(
        _f(2, 64, HQ, D), _f(2, 64, HKV, D), _i32([64, 40]), _f(2, 16, HKV, D), backend="triton"
    ),
    "topb_gather": lambda: tk.topb_gather(
        torch.rand(2, HKV, 64), _f(2, 64, HKV, D), _f(2, 64, HKV, D), 16, lens=_i32([64, 40]), backend="triton"
    ),
    "add_rms_norm": lambda: tk.add_rms_norm(_f(8, 256), _f(256), 1e-6, _f(8, 256), backend="triton"),
    "rope_qk": lambda: tk.rope_qk(
        _f(1, 8, HQ, D), _f(1, 8, HKV, D), torch.randn(1, 8, D), torch.randn(1, 8, D), backend="triton"
    ),
    "swiglu": lambda: tk.swiglu(_f(8, 256), _f(8, 256), backend="triton"),
}


class _Capture:
    """Stands in for a kernel while an op runs: ``kernel[grid](*args, ...)`` records the launch, runs nothing.
    Not a JITFunction, so ``_launch.launch`` hands it every launch through ``kernel[grid]``."""

    def __init__(self, name, sink):
        self.name, self.sink = name, sink

    def __getitem__(self, grid):
        def run(*args, num_warps, num_stages=None):
            self.sink.append((self.name, tuple(grid), args, num_warps, num_stages))

        return run


IN_WORKER = os.environ.get(WORKER) == "1"


def _unusable() -> str | None:
    if torch.cuda.is_available():
        return "a real CUDA driver is loaded: bench/kernels/launch_check.py checks the direct path on the GPU"
    return missing_toolchain()


def test_direct_launch_checks_in_a_clean_process():
    """Runs this module in a new process with the interpreter off, where its other tests run; passes when
    they all pass (their output is the failure message), skips with their reason when they skip."""
    if IN_WORKER:
        pytest.skip("this is that process")
    reason = _unusable()
    if reason:
        pytest.skip(reason)
    proc = run_clean(Path(__file__))
    out = proc.stdout
    assert proc.returncode == 0, out[-8000:]
    skips = [line for line in out.splitlines() if line.startswith("SKIPPED") and "this is that process" not in line]
    if skips:
        pytest.skip("; ".join(skips))
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) >= 1 + len(OPS), out[-3000:]


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    """Triton's CUDA launcher against the stand-in libcuda (see tests/fake_cuda_driver.py)."""
    if not IN_WORKER:
        pytest.skip("runs in a process of its own: test_direct_launch_checks_in_a_clean_process")
    reason = _unusable()
    if reason:
        pytest.skip(reason)
    with fake_cuda_driver(tmp_path_factory.mktemp("triton_cache")) as f:
        yield f


@pytest.fixture(scope="module")
def launches(fake):
    """Per op: the launches it makes, as ``(kernel name, grid, args, num_warps, num_stages)``."""
    out, sink = {}, []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_validate, "_PASSED", {})  # the prepared calls made here hold the stand-ins: dropped after
        for name, kernel in fake.kernels.items():
            for mod in [m for n, m in sys.modules.items() if n.startswith("triton_kernels.")]:
                if getattr(mod, name, None) is kernel:
                    mp.setattr(mod, name, _Capture(name, sink))
        for op, call in OPS.items():
            with assume_gpu(H200), tk.skip_value_checks():
                call()
            out[op], sink[:] = list(sink), []
    return out


@contextlib.contextmanager
def _grown(key: str, by: int, what: str):
    before = _launch.COUNTS[key]
    yield
    assert _launch.COUNTS[key] - before == by, f"{what}: COUNTS[{key!r}] grew by {_launch.COUNTS[key] - before}"


def _reference(fake, kernel, grid, args, num_warps, num_stages):
    """Launch through ``kernel[grid]`` (Triton's JITFunction.run) with the parameter sizes registered; returns
    its record."""
    opts = {"num_warps": num_warps} if num_stages is None else {"num_warps": num_warps, "num_stages": num_stages}
    compiled = kernel[grid](*args, **opts)  # compiles on first use; the launcher exists after a launch
    fake.register(compiled)
    fake.reset()
    kernel[grid](*args, **opts)
    (ref,) = fake.records()
    assert ref.params is not None and ref.stream == fake.stream and ref.function == compiled.function
    return ref


def _explain(ref, rec) -> str:
    """The fields in which ``rec`` differs from ``ref``, each with both values."""
    parts = []
    for field in ref.differences(rec):
        if field.startswith("params["):
            i = int(field[7:-1])
            parts.append(f"{field}: {ref.params[i].hex()} != {rec.params[i].hex()}")
        else:
            parts.append(f"{field}: {getattr(ref, field)!r} != {getattr(rec, field)!r}")
    return "; ".join(parts)


def _pointer_count(args) -> int:
    """The leading tensor arguments: what an op's PreparedLaunch takes per call (the rest is its tail)."""
    n = 0
    while n < len(args) and isinstance(args[n], torch.Tensor):
        n += 1
    return n


def test_every_kernel_is_covered(fake, launches):
    """The ops' calls above launch every kernel of the package, and the package has no other kernel."""
    assert set(fake.kernels) == KERNELS
    assert {name for calls in launches.values() for name, *_ in calls} == KERNELS


@pytest.mark.parametrize("op", sorted(OPS))
def test_direct_launch_matches_kernel_grid(fake, launches, op):
    """Every launch of ``op``: ``kernel[grid]``, ``_launch.launch`` twice (the second direct) and a
    ``PreparedLaunch`` twice (both direct) make identical driver calls, parameter bytes included."""
    assert launches[op], f"{op} launched nothing"
    for name, grid, args, num_warps, num_stages in launches[op]:
        kernel = fake.kernels[name]
        ref = _reference(fake, kernel, grid, args, num_warps, num_stages)
        assert ref.name == name
        _launch.clear_launch_cache()
        fake.reset()
        with _grown("jit", 1, f"{name}: first launch"):
            _launch.launch(kernel, grid, args, num_warps, num_stages)
        with _grown("direct", 1, f"{name}: second launch"):
            _launch.launch(kernel, grid, args, num_warps, num_stages)
        n = _pointer_count(args)
        prepared = _launch.PreparedLaunch(kernel, grid, args[n:], num_warps, num_stages)
        with _grown("direct", 2, f"{name}: prepared calls"):
            prepared(args[:n], True)
            prepared(args[:n], True)
        got = fake.records()
        assert len(got) == 4, f"{name}: {len(got)} driver launches for 4 calls"
        for what, rec in zip(("launch, kernel[grid]", "launch, direct", "prepared", "prepared, direct"), got):
            assert ref.differences(rec) == [], f"{name} {grid} ({what}) differs from kernel[grid]: {_explain(ref, rec)}"


def test_misaligned_arguments_after_aligned_ones_match_kernel_grid(fake, launches):
    """Triton specialises on 16-byte alignment: the same launch with its tensors moved 2 bytes off alignment,
    after the aligned one was cached, hands the driver what ``kernel[grid]`` does for the misaligned tensors."""
    name, grid, args, num_warps, num_stages = launches["swiglu"][0]
    kernel = fake.kernels[name]

    def shifted(t):
        if not isinstance(t, torch.Tensor):
            return t
        buf = torch.empty(t.numel() + 8, dtype=t.dtype)
        view = buf[1 : 1 + t.numel()].view(t.shape)
        assert view.data_ptr() % 16 != 0
        return view

    off = tuple(shifted(a) for a in args)
    ref_aligned = _reference(fake, kernel, grid, args, num_warps, num_stages)
    ref = _reference(fake, kernel, grid, off, num_warps, num_stages)
    assert ref.function != ref_aligned.function  # another specialisation, another compiled kernel
    _launch.clear_launch_cache()
    _launch.launch(kernel, grid, args, num_warps, num_stages)
    with _grown("direct", 1, "aligned, second launch"):
        _launch.launch(kernel, grid, args, num_warps, num_stages)  # the aligned kernel cached and used
    fake.reset()
    _launch.launch(kernel, grid, off, num_warps, num_stages)
    with _grown("direct", 1, "misaligned, second launch"):
        _launch.launch(kernel, grid, off, num_warps, num_stages)
    got = fake.records()
    assert len(got) == 2
    for what, rec in zip(("first", "second (direct)"), got):
        assert ref.differences(rec) == [], f"misaligned, {what} launch: {_explain(ref, rec)}"


@pytest.fixture
def one_launch(fake, launches):
    """The first launch of add_rms_norm, with its reference record and an empty launch cache."""
    name, grid, args, num_warps, num_stages = launches["add_rms_norm"][0]
    kernel = fake.kernels[name]
    ref = _reference(fake, kernel, grid, args, num_warps, num_stages)
    _launch.clear_launch_cache()
    _launch.launch(kernel, grid, args, num_warps, num_stages)  # kernel[grid]; cached for the direct path
    fake.reset()
    return kernel, grid, args, num_warps, num_stages, ref


def test_records_tell_a_wrong_stream_apart(fake, one_launch, monkeypatch):
    """A direct launch on another stream than the current one shows as a different ``stream``, nothing else."""
    kernel, grid, args, num_warps, num_stages, ref = one_launch
    assert len(_launch._CURRENT) == 2  # bound by the launch above: [get_current_device, get_current_stream]
    monkeypatch.setattr(_launch, "_CURRENT", [_launch._CURRENT[0], lambda device: fake.stream + 0x100])
    with _grown("direct", 1, "direct launch"):
        _launch.launch(kernel, grid, args, num_warps, num_stages)
    (rec,) = fake.records()
    assert ref.differences(rec) == ["stream"]


def test_records_tell_a_wrong_grid_apart(fake, one_launch):
    """Another grid shows as a different ``grid``, nothing else."""
    kernel, grid, args, num_warps, num_stages, ref = one_launch
    _launch.launch(kernel, (grid[0] + 1, *grid[1:]), args, num_warps, num_stages)
    (rec,) = fake.records()
    assert ref.differences(rec) == ["grid"]


def test_records_tell_another_pointer_apart(fake, one_launch):
    """Another tensor (same dtype, shape and alignment) in the first argument shows as a different first
    parameter: the parameter bytes are the launch's own, not a constant."""
    kernel, grid, args, num_warps, num_stages, ref = one_launch
    other = args[0].clone()
    assert other.data_ptr() % 16 == 0
    with _grown("direct", 1, "direct launch"):
        _launch.launch(kernel, grid, (other, *args[1:]), num_warps, num_stages)
    (rec,) = fake.records()
    assert ref.differences(rec) == ["params[0]"]
    assert rec.params[0] == other.data_ptr().to_bytes(8, "little")
