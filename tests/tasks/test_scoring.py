"""InfiniteBench-style scorers on hand-written predictions."""

from __future__ import annotations

import pytest

from dllm.eval.tasks import make_case, score
from dllm.eval.tasks.scoring import first_integer


def test_first_integer():
    assert first_integer("The pass key is 71432.") == "71432"
    assert first_integer("no digits") == ""
    assert first_integer("007 and 8") == "007"


@pytest.mark.parametrize(
    "prediction, ok",
    [
        ("71432", True),
        ("The pass key is 71432.", True),
        ("71432. Remember it. 71432 is the pass key.", True),
        (" 71432 and then 12345", True),
        ("7143", False),
        ("The pass key is 71433", False),
        ("714321", False),
        ("71,432", False),
        ("12345 no wait 71432", False),  # only the first integer counts
        ("", False),
    ],
)
def test_passkey(prediction, ok):
    assert score("passkey", prediction, "71432") is ok


def test_number_string():
    assert score("number_string", "3918402756.", "3918402756")
    assert not score("number_string", "391840275", "3918402756")
    assert not score("number_string", "3918402756 1", "391840275")


def test_kv_retrieval():
    gold = "e08406d1-9b37-44c7-8a0f-322e629835cd"
    assert score("kv_retrieval", gold, gold)
    assert score("kv_retrieval", f'The value is "{gold}".', gold)
    assert score("kv_retrieval", f"{{'{gold}'}}\nok", gold)
    assert score("kv_retrieval", f"value:{gold}, done!", gold)
    assert not score("kv_retrieval", gold[:-1], gold)
    assert not score("kv_retrieval", gold + "0", gold)
    assert not score("kv_retrieval", "e08406d1", gold)


def test_needle():
    assert score("needle", "Cardamom.", "cardamom")
    assert score("needle", "It is inside the Blue  Teapot, I think", "blue teapot")
    assert not score("needle", "saffron", "cardamom")
    assert not score("needle", "blue", "blue teapot")
    assert not score("needle", "anything", "")


def test_score_with_case_and_unknown_task():
    case = make_case("passkey", 300, 0.5, 0)
    assert score("passkey", case.answer + ".", case)
    assert not score("passkey", "00000", case)
    with pytest.raises(ValueError, match="unknown task"):
        score("retrieval", "1", "1")
