"""Multi-part questions (dllm/eval/tasks/multipart.py): documents, answers and the part-by-part score."""

import re

import pytest

from dllm.eval.tasks.multipart import (
    answer_text,
    crop_parts,
    make_multipart,
    needle_text,
    part_scores,
    query_text,
)
from dllm.eval.tasks.reports import make_report


@pytest.mark.parametrize("length,n", [(4096, 2), (4096, 4), (16384, 3), (65536, 4)])
def test_keys_sit_far_apart_once_each_in_their_numbered_needles(length, n):
    case = make_multipart(length, n, seed=7)
    assert len(case.context) <= length and len(case.keys) == n == len(case.spans)
    starts = []
    for i, (key, (s, e)) in enumerate(zip(case.keys, case.spans)):
        sentence = case.context[s:e]
        assert re.fullmatch(r"\d{5}", key) and f"pass key number {i + 1} is {key}." in sentence
        # the key occurs in the document only inside its needle, not inside a longer number either
        assert len(re.findall(rf"(?<!\d){key}(?!\d)", case.context)) == sentence.count(key)
        assert not re.search(rf"\d{key}|{key}\d", case.context)
        starts.append(s)
    assert starts == sorted(starts)  # first to last in document order
    gaps = [b - a for a, b in zip([0, *starts], [*starts, len(case.context)])]
    assert min(gaps[1:-1], default=length) > 0.25 * length / n  # each in its own share, not bunched
    assert case.answer == " ".join(f"The pass key number {i} is {k}." for i, k in enumerate(case.keys, 1))
    assert case.query == f"\n\nWhat are the pass keys number 1 to {n}? "


def test_documents_are_seeded_and_carry_the_registers_distractors():
    a, b = make_multipart(8192, 3, seed=1), make_multipart(8192, 3, seed=1)
    assert a == b and make_multipart(8192, 3, seed=2).context != a.context
    # title lines with dates and numbered sections are there, and no key is among the other numbers
    assert re.search(r"volume \d+, closed", a.context) and re.search(r"\n\d\. [A-Z]", a.context)
    others = set(re.findall(r"\d+", a.context)) - set(a.keys)
    assert others and not others & set(a.keys)
    dense = make_multipart(8192, 3, seed=1, distractor_share=0.45)
    assert len(re.findall(r"\d+", dense.context)) > 2 * len(re.findall(r"\d+", a.context))


def test_the_document_is_the_register_generator_with_the_needles_put_in():
    # the filler comes from the same register generator as make_report's held-out documents
    register = make_report(8192, [("passkey", 0.5)], 3, distractor_share=0.0).context
    case = make_multipart(8192, 2, seed=3)
    assert "Register of the" in register and "Register of the" in case.context


@pytest.mark.parametrize(
    "prediction,expected",
    [
        ("The pass key number 1 is 11111. The pass key number 2 is 22222. The pass key number 3 is 33333.", [1, 1, 1]),
        ("The pass key number 1 is 11111. The pass key number 2 is 22223. The pass key number 3 is 33333.", [1, 0, 1]),
        ("The pass key number 2 is 22222. The pass key number 1 is 11111.", [1, 1, 0]),  # order of mention is free
        ("the PASS KEY number 1 is 11111", [1, 0, 0]),  # case is free
        ("11111 22222 33333", [0, 0, 0]),  # keys without their numbers are not parts
        ("The pass key number 1 is 22222. The pass key number 2 is 11111.", [0, 0, 0]),  # swapped keys
        ("The pass key number 1 is 99999. The pass key number 1 is 11111.", [0, 0, 0]),  # the first mention counts
        ("The pass key number 1 is 111112.", [0, 0, 0]),  # a longer number is not the key
        ("The pass key number 12 is 11111.", [0, 0, 0]),  # number 12 is not number 1
        ("", [0, 0, 0]),
    ],
)
def test_part_scores_read_each_ordinal_once(prediction, expected):
    assert part_scores(prediction, ("11111", "22222", "33333")) == [bool(x) for x in expected]


def test_the_gold_answer_scores_every_part_and_round_trips():
    case = make_multipart(4096, 4, seed=5)
    assert part_scores(case.answer, case.keys) == [True] * 4
    assert answer_text(case.keys) == case.answer
    assert needle_text(2, "12345") == "The pass key number 3 is 12345."


def test_crop_holds_every_part_in_order_within_its_width():
    case = make_multipart(32768, 3, seed=4)
    crop = crop_parts(case.context, case.spans, 900)
    assert len(crop) <= 900 + 2
    at = [crop.index(case.context[s:e]) for s, e in case.spans]
    assert at == sorted(at)
    assert part_scores(crop, case.keys) == [True] * 3  # every needle wording reads as its part


@pytest.mark.parametrize("n", [1, 5, 0, True, 2.0])
def test_part_counts_outside_two_to_four_are_refused(n):
    with pytest.raises(ValueError, match="2 to 4 parts"):
        make_multipart(4096, n, seed=0)
    with pytest.raises(ValueError, match="2 to 4 parts"):
        query_text(n)


def test_bad_lengths_and_shares_are_refused():
    with pytest.raises(ValueError, match="too short"):
        make_multipart(600, 4, seed=0)
    with pytest.raises(ValueError, match="distractor_share"):
        make_multipart(4096, 2, seed=0, distractor_share=1.5)
    with pytest.raises(ValueError, match="2 to 4 parts"):
        answer_text(["12345"])
