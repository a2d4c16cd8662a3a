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

if os.environ.get("PYTEST_XDIST_WORKER"):
    # make test runs one pytest-xdist worker per core: a second OpenMP team per worker (and per subprocess a
    # test starts) would oversubscribe the cores, which on a busy 2-core box makes torch ops many times slower
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


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


@pytest.fixture(scope="session")
def held_runs():
    """12-word runs of every held-out text the training phases must not see: the held-out sources devil, registers and
    debian-changelog whole, and the evaluation splits of the essays and pydoc topics (whose training splits
    the phases use), raw and as the prose haystacks read them (digit-holding words dropped). A run that the
    training split holds as well is not held-out text (pydoc topics repeat sentences across topics: "the
    local and global namespaces of the caller ..." is in a training and an evaluation topic)."""
    from pydoc_data.topics import topics

    from bench.tiny import sources
    from dllm.eval.tasks.essays import load_essays
    from dllm.eval.tasks.prose import prose_docs, pydoc_topic_names

    split = {}
    for name in ("train", "eval"):
        runs = set()
        for _, t in load_essays(name):
            runs |= sources.word_runs(t)
        for topic in pydoc_topic_names(name):
            runs |= sources.word_runs(sources.to_charset(topics[topic]))
        for h in ("essays", "pydoc"):
            for words in prose_docs(h, name):
                runs |= sources.word_runs(" ".join(words))
        split[name] = runs
    return sources.held_out_runs(("devil", "registers", "debian-changelog")) | (split["eval"] - split["train"])
