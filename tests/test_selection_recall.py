"""bench.selection_recall: needle-chunk recall from a results CSV."""

from bench.selection_recall import recall_table
from dllm.eval.tasks import make_case


def _row(length, depth, seed, selected, correct):
    return {
        "task": "passkey",
        "length": str(length),
        "depth": str(depth),
        "seed": str(seed),
        "method": "prefilling",
        "selected_chunks": " ".join(map(str, selected)),
        "correct": str(correct),
    }


def test_recall_counts_a_kept_needle_chunk_found_by_searching_the_text():
    case = make_case("passkey", 3000, 0.5, 11, tokenizer=None)
    hit = case.context.find(case.answer) // 128  # the pass key's first occurrence, found independently
    far = (hit + 10) % (3000 // 128)
    rows = [
        _row(3000, 0.5, 11, [hit, far], True),
        _row(3000, 0.5, 11, [far], False),
        {**_row(3000, 0.5, 11, [far], False), "method": "dense"},  # ignored
    ]
    table = recall_table(rows, 128)
    assert "| passkey | 3000 | 50% | 50% | 2 |" in table
