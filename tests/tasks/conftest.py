"""Shared fixtures for the task-suite tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def find_qwen_tokenizer() -> Path | None:
    """The Dream (Qwen2) tokenizer folder: ``shared/reference/dream-v0-7b/tokenizer``
    in a ``shared/`` folder beside the repository root or any folder above this
    file (``/work/shared`` for developers, ``../shared`` in CI)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        cand = parent / "shared" / "reference" / "dream-v0-7b" / "tokenizer"
        if cand.is_dir():
            return cand
        cand = parent.parent / "shared" / "reference" / "dream-v0-7b" / "tokenizer"
        if cand.is_dir():
            return cand
    return None


@pytest.fixture(scope="session")
def qwen_tokenizer():
    path = find_qwen_tokenizer()
    if path is None:
        pytest.skip(
            "Dream/Qwen2 tokenizer not found (expected shared/reference/dream-v0-7b/tokenizer "
            "in a shared/ folder beside the repository)"
        )
    transformers = pytest.importorskip("transformers")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return transformers.AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="session")
def essays_available():
    from dllm.tasks.essays import essay_dir

    try:
        essay_dir()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    return True
