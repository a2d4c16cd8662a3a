"""Kernel tests: every buffer a launcher allocates starts as NaN, so unwritten slots fail. Also the
fake compiled kernel of the direct launch path's tests."""

import pytest
import torch

from triton_kernels import _launch
from triton_kernels._dispatch import poison_outputs


@pytest.fixture(autouse=True)
def _poison_kernel_outputs():
    with poison_outputs():
        yield


@pytest.fixture(autouse=True, scope="package")
def _one_cpu_thread():
    """CPU runs: tensors here are tiny and the interpreter is single-threaded, while an
    OpenMP team on a 2-core CI box costs milliseconds per op (measured: a 2 MB clone
    takes 8 ms on 2 threads, 0.05 ms on 1). Restored afterwards for other test packages."""
    if torch.cuda.is_available():
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


class FakeCompiled:
    """Stands in for Triton's CompiledKernel: records the calls of its launcher."""

    function, packed_metadata = 7, ("packed",)

    def __init__(self):
        self.calls = []

    def run(self, *args):
        self.calls.append(args)


@pytest.fixture
def fake_launcher(monkeypatch):
    """The direct launch path on, a fake device and stream, an empty launch cache, and ``kernel[grid]``
    replaced by a recorder that returns a :class:`FakeCompiled`: yields ``(compiled, jit_calls)``, where
    ``jit_calls`` gets the ``(grid, args)`` of every ``kernel[grid]`` launch and ``compiled.calls`` the
    arguments of every direct one."""
    compiled = FakeCompiled()
    jit_calls = []
    monkeypatch.setattr(_launch, "_DIRECT", True)
    monkeypatch.setattr(_launch, "_CURRENT", [lambda: 0, lambda device: 1000 + device])
    monkeypatch.setattr(
        _launch, "_jit_launch", lambda k, grid, args, nw, ns: jit_calls.append((grid, args)) or compiled
    )
    monkeypatch.delenv("PREFILLING_DLLM_DIRECT_LAUNCH", raising=False)
    _launch.clear_launch_cache()
    yield compiled, jit_calls
    _launch.clear_launch_cache()
