"""bench.tiny.prose_eval: the held-out grid, the needle-chunk check and the report table."""

from bench.tiny.prose_eval import SEED_BASE, case_spans, eval_cases, needle_kept, table
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
    spans = [(s, min(256, len(case.context) - s)) for s in range(0, len(case.context), 256)]
    first, last = case.needle_start // 256, (case.needle_end - 1) // 256
    assert needle_kept(case, f"{last} 7", spans) and needle_kept(case, str(first), spans)
    assert not needle_kept(case, " ".join(str(i) for i in range(8) if i not in (first, last)), spans)
    assert not needle_kept(case, "", spans)


def test_needle_kept_follows_snapped_spans():
    # a boundary moved back to the needle's start: the chunk before no longer holds any of it
    case = make_case("passkey", 2000, 0.5, 0, haystack="pydoc")
    a = case.needle_start
    spans = [(0, a), (a, case.needle_end - a), (case.needle_end, len(case.context) - case.needle_end)]
    assert needle_kept(case, "1", spans) and not needle_kept(case, "0 2", spans)


def test_case_spans_are_the_prefill_chunks():
    from dllm.model.loader import load_model
    from dllm.prefilling import PrefillingConfig

    model = load_model()
    case = make_case("passkey", 2000, 0.5, 0, haystack="essays", split="eval")
    fixed = case_spans(model, case, PrefillingConfig(chunk_size=256))
    assert fixed[0] == (0, 256) and sum(n for _, n in fixed) == len(case.context)
    snapped = case_spans(model, case, PrefillingConfig(chunk_size=256, boundary_snap=64))
    assert sum(n for _, n in snapped) == len(case.context) and all(n <= 256 for _, n in snapped)
    # every snapped boundary but the last sits right after a sentence end, or at the fixed cut
    for s, n in snapped[:-1]:
        assert case.context[s + n - 1] in ".!?\n" or n == 256


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


def test_tuning_seeds_are_other_cases_than_the_evaluations():
    grid = dict(haystacks=["essays"], tasks=["number_string"], lengths=[4096], depths=[0.5])
    recorded = eval_cases(**grid, seeds=3)
    tuning = eval_cases(**grid, seeds=3, first_seed=3)
    assert [c.seed for _, c in tuning] == [SEED_BASE + 3, SEED_BASE + 4, SEED_BASE + 5]
    assert {c.answer for _, c in recorded}.isdisjoint(c.answer for _, c in tuning)
    assert eval_cases(**grid, seeds=6)[3:] == tuning  # the same cases as a longer grid's tail
