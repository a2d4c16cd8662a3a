"""Test-wide setup. Runs before any test module imports triton_kernels.

Without CUDA the Triton kernels can only run through the Triton interpreter,
which reads TRITON_INTERPRET when ``@triton.jit`` decorates a kernel, i.e. at
import time; so it is set here, before the first kernel import.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module of tiny tensors: an OpenMP team on a busy 2-core box costs milliseconds per
    op (see tests/kernels/conftest.py). A module asks for it: ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture()
def files(tmp_path, monkeypatch, request):
    """The command line tests' working directory: ``tests.cli_files.make_files`` in ``tmp_path``, made current."""
    from tests.cli_files import make_files

    return make_files(tmp_path, monkeypatch, request.node.name)
