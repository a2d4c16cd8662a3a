"""Kernel tests: every buffer a launcher allocates starts as NaN, so unwritten slots fail."""

import pytest
import torch

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
