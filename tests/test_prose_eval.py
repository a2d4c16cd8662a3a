"""bench.tiny.prose_eval: the held-out grid, the needle-chunk check and the report table."""

from bench.tiny.prose_eval import SEED_BASE, eval_cases, needle_kept, table
from dllm.eval.tasks import make_case


def test_grid_is_the_held_out_cases_in_order():
    cases = eval_cases(["pydoc"], ["passkey", "word_fact"], [600], [0.0, 1.0], 2)
    assert [(h, c.task, c.depth, c.seed) for h, c in cases] == [
        ("pydoc", t, d, SEED_BASE + s) for t in ("passkey", "word_fact") for d in (0.0, 1.0) for s in (0, 1)
    ]
    want = make_case("word_fact", 600, 1.0, SEED_BASE + 1, phrasing="random", split="eval", haystack="pydoc")
    assert cases[-1][1] == want and all(c.split == "eval" for _, c in cases)


def test_needle_kept_reads_character_chunks():
    case = make_case("passkey", 2000, 0.5, 0, haystack="pydoc")
    first, last = case.needle_start // 256, (case.needle_end - 1) // 256
    assert needle_kept(case, f"{last} 7", 256) and needle_kept(case, str(first), 256)
    assert not needle_kept(case, " ".join(str(i) for i in range(8) if i not in (first, last)), 256)
    assert not needle_kept(case, "", 256)


def test_table_counts_exact_and_kept_per_cell():
    rows = [
        {"haystack": "essays", "method": "prefilling", "length": 4096, "correct": True, "kept": True},
        {"haystack": "essays", "method": "prefilling", "length": 4096, "correct": False, "kept": True},
        {"haystack": "essays", "method": "prefilling", "length": 4096, "correct": False, "kept": False},
        {"haystack": "essays", "method": "dense", "length": 1024, "correct": True, "kept": ""},
    ]
    lines = table(rows, ("haystack", "method", "length")).splitlines()
    assert lines[2] == "| essays | dense | 1024 | 100% (1/1) | - | 1 |"
    assert lines[3] == "| essays | prefilling | 4096 | 33% (1/3) | 67% (2/3) | 3 |"
