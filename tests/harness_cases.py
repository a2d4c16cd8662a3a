"""The cases of the local harness tasks under tests/data/harness/ (``python -m tests.harness_cases`` rewrites
their JSONL files; tests/test_harness.py checks that the files equal what these functions make)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from dllm.eval.tasks import make_case, make_cases

HARNESS_DIR = Path(__file__).parent / "data" / "harness"
# dllm eval passkey --lengths 512 --depths 0 0.5 1 --samples 1 (seed base 0)
PASSKEY_GRID = {"lengths": [512], "depths": [0.0, 0.5, 1.0], "n": 1, "seed": 0}
CHOICE_CASES = 3  # short prompts of the multiple-choice task


def passkey_rows(tokenizer) -> list[dict]:
    """The dllm_passkey rows: the cases ``dllm eval passkey`` makes for :data:`PASSKEY_GRID`."""
    g = PASSKEY_GRID
    cases = make_cases("passkey", g["lengths"], g["depths"], g["n"], g["seed"], tokenizer=tokenizer)
    return [{"prefix": c.prefix, "context": c.context, "query": c.query, "answer": c.answer} for c in cases]


def choice_rows(tokenizer) -> list[dict]:
    """The dllm_passkey_choice rows: a 256-token passkey prompt; choices the gold key and two keys one digit
    off (the last digit, the first digit), in a seeded order; ``label`` the gold key's index."""
    rows = []
    for seed in range(CHOICE_CASES):
        case = make_case("passkey", 256, 0.5 * seed, 100 + seed, tokenizer=tokenizer)
        gold = case.answer
        last = gold[:-1] + str((int(gold[-1]) + 1) % 10)
        first = str(int(gold[0]) % 9 + 1) + gold[1:]  # stays a 5-digit key without a leading zero
        choices = [gold, last, first]
        random.Random(seed).shuffle(choices)
        rows.append({"prompt": case.prompt, "choices": choices, "label": choices.index(gold)})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    from dllm.model.loader import default_model_dir, load_tokenizer

    tok = load_tokenizer(default_model_dir())
    write_jsonl(HARNESS_DIR / "passkey.jsonl", passkey_rows(tok))
    write_jsonl(HARNESS_DIR / "passkey_choice.jsonl", choice_rows(tok))
