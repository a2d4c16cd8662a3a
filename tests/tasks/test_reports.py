"""The held-out register documents (dllm.eval.tasks.reports): seeded, one needle per task, its
answer nowhere else, distractors near and away from it, and a crop that holds it."""

import re

import pytest

from dllm.eval.tasks.reports import crop_around, dictionary_sentences, make_report

DIGITS = re.compile(r"\d{4,}")


def test_same_seed_same_document_other_seed_other_document():
    a = make_report(4096, [("passkey", 0.5)], 7)
    assert a == make_report(4096, [("passkey", 0.5)], 7)
    b = make_report(4096, [("passkey", 0.5)], 8)
    assert b.context != a.context and b.needles[0].answer != a.needles[0].answer


@pytest.mark.parametrize("task", ["passkey", "number_string", "word_fact"])
@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_the_needle_is_there_once_and_its_answer_only_inside_it(task, depth):
    rep = make_report(4096, [(task, depth)], 3)
    assert 3900 <= len(rep.context) <= 4096
    n = rep.needles[0]
    sentence = rep.context[n.start : n.end]
    assert n.answer in sentence and rep.context.count(sentence) == 1
    outside = rep.context[: n.start] + "|" + rep.context[n.end :]
    assert n.answer.lower() not in outside.lower()  # a digit answer is not even part of a longer number
    assert abs(n.start / len(rep.context) - depth) < 0.12


def test_distractors_near_the_needle_and_away_from_it():
    rep = make_report(16384, [("passkey", 0.5)], 11)
    n, text = rep.needles[0], rep.context
    near = text[max(0, n.start - 120) : n.start] + " " + text[n.end : n.end + 120]
    assert DIGITS.search(near), near  # a code, account or amount in the sentences around the needle
    away = text[: n.start - 2000] + text[n.end + 2000 :]
    assert len(DIGITS.findall(away)) >= 50  # numbers all over the rest of the document
    for i in range(1, 9):  # the section headings "1." to "8."
        assert re.search(rf"\n\n{i}\. [A-Z][a-z]+\n", text)
    assert re.search(r"\b1[89]\d\d-\d\d-\d\d\b|\b\d{1,2}/\d{1,2}/1[89]\d\d\b|[A-Z][a-z]+ \d{1,2}, 1[89]\d\d", text)
    assert re.search(r"\$\d", text)  # amounts
    prose = [s for s in dictionary_sentences() if len(s) > 60]
    assert sum(s in text for s in prose) >= 10  # the held-out dictionary's prose fills it


def test_fewer_numbers_when_asked():
    dense = make_report(16384, [("passkey", 0.5)], 4)
    sparse = make_report(16384, [("passkey", 0.5)], 4, distractor_share=0.0, near_distractors=False)
    count = lambda rep: len(DIGITS.findall(rep.context))  # noqa: E731
    assert count(sparse) < count(dense) / 3
    n = sparse.needles[0]
    assert sparse.context[n.start - 1] == " " and not re.search(r"\d", sparse.context[n.end : n.end + 2])


def test_three_needles_in_one_long_document_in_depth_order():
    rep = make_report(65536, [("passkey", 0.1), ("number_string", 0.9), ("word_fact", 0.5)], 2)
    starts = {n.task: n.start for n in rep.needles}
    assert starts["passkey"] < starts["word_fact"] < starts["number_string"]
    for n in rep.needles:
        outside = rep.context[: n.start] + "|" + rep.context[n.end :]
        assert n.answer.lower() not in outside.lower()
        case = rep.case(rep.needles.index(n))
        assert case.prompt == n.prefix + rep.context + n.query and case.needle == rep.context[n.start : n.end]


def test_the_crop_holds_the_needle_inside_width():
    rep = make_report(16384, [("number_string", 0.5)], 5)
    n = rep.needles[0]
    crop, off = crop_around(rep.context, n.start, n.end, 1024)
    assert len(crop) <= 1024 and crop in rep.context
    assert crop[off : off + n.end - n.start] == rep.context[n.start : n.end]
    assert 300 < off < 700  # centred
    first = make_report(4096, [("passkey", 0.0)], 5).needles[0]
    c0, o0 = crop_around(make_report(4096, [("passkey", 0.0)], 5).context, first.start, first.end, 1024)
    assert len(c0) >= 900 and o0 == first.start  # at the document's start the crop starts there too


def test_bad_arguments_are_errors():
    with pytest.raises(ValueError, match="task"):
        make_report(4096, [("kv_retrieval", 0.5)], 0)
    with pytest.raises(ValueError, match="one needle"):
        make_report(4096, [("passkey", 0.5), ("passkey", 0.1)], 0)
    with pytest.raises(ValueError, match="too short"):
        make_report(600, [("passkey", 0.5)], 0)
    with pytest.raises(ValueError, match="depth"):
        make_report(4096, [("passkey", 1.5)], 0)
    with pytest.raises(ValueError, match="distractor_share"):
        make_report(4096, [("passkey", 0.5)], 0, distractor_share=1.5)
    with pytest.raises(ValueError, match="span"):
        crop_around("abc def", 3, 3)
