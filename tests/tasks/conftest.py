"""Shared fixtures for the task-suite tests."""

from __future__ import annotations

import os

import pytest

from tests.tiny_checkpoints import reference_file


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """The real Dream (Qwen2) tokenizer, vendored under tests/data/reference (skips if absent)."""
    path = reference_file("dream-v0-7b", "tokenizer", "vocab.json")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from dllm.model.loader import load_tokenizer

    return load_tokenizer(os.path.dirname(path))


@pytest.fixture(scope="session")
def essays_available():
    from dllm.eval.tasks.essays import essay_dir

    try:
        essay_dir()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    return True
