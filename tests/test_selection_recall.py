"""bench.fidelity.selection_recall: needle-chunk recall from a results CSV."""

from bench.fidelity.selection_recall import recall_table
from dllm.eval.tasks import make_case
from tests.tiny_checkpoints import snapped_starts


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


def test_needle_chunk_ids_follow_snapped_boundaries():
    from bench.fidelity.selection_recall import needle_chunk_ids

    case = make_case("passkey", 4096, 0.5, 3, tokenizer=None)  # depth 0.5: the fixed cut at 2048 is near it
    starts = snapped_starts(case.context, 256, 64) + [len(case.context)]
    want = {j for j in range(len(starts) - 1) if starts[j] < case.needle_end and case.needle_start < starts[j + 1]}
    assert needle_chunk_ids(case, 256, 64) == want
    fixed = needle_chunk_ids(case, 256)
    assert fixed == set(range(case.needle_start // 256, (case.needle_end - 1) // 256 + 1))
    assert len(fixed) == 2 and len(want) == 1  # the fixed cut splits the needle sentence, the snapped one does not
