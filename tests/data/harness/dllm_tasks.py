"""Loaders of the local harness tasks in this folder: their JSONL files, read in memory (no network, no
datasets cache). lm-eval calls ``custom_dataset(**metadata)``; the metadata (model args among them) is unused."""

import json
from pathlib import Path

HERE = Path(__file__).parent


def _rows(name):
    with open(HERE / name, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _dataset(name):
    import datasets

    return datasets.DatasetDict({"test": datasets.Dataset.from_list(_rows(name))})


def passkey(**_metadata):
    """dllm_passkey: passkey cases (prefix, context, query, answer), as ``dllm eval passkey`` makes them."""
    return _dataset("passkey.jsonl")


def passkey_choice(**_metadata):
    """dllm_passkey_choice: short passkey prompts, the gold key among distractor keys (choices, label)."""
    return _dataset("passkey_choice.jsonl")
