"""Phase 12's layout (bench/tiny/distractors.py): chunked answers with number-dense chunks beside the needle's.

Checked by decoding the character ids back to text: the answer is the only masked span and is copied from
exactly one chunk, the chunks beside it hold numbers, and no sample holds text of a held-out source.
"""

import dataclasses
import random
import re
from collections import Counter

import torch

from bench.tiny import curriculum, distractors, sources
from bench.tiny.curriculum import PHASES, draw_sample
from bench.tiny.tokenizer import CHARS
from bench.tiny.train import make_batch
from dllm.eval.tasks.digits import NUMBER_STRING, PASSKEY
from tests.mix_shares import assert_shares, assert_trial_phase

PREFIXES = set(PASSKEY.wording.prefixes) | set(NUMBER_STRING.wording.prefixes)
DIGITS = re.compile(r"\d+")


def text(ids):
    return "".join(CHARS[i - 4] if i >= 4 else f"<{i}>" for i in ids)


def segments(s):
    """The static segments' texts (BOS dropped) in order, the instruction prefix's left out."""
    out = {}
    for t, g in zip(s.ids, s.segment):
        if g > 0 and t >= 4:
            out[g] = out.get(g, "") + CHARS[t - 4]
    return [v for _, v in sorted(out.items()) if v not in PREFIXES]


def phase12():
    return next(ph for ph in PHASES if any(lay.kind == "distractors" for _, lay in ph.mix))


def only_distractors():
    ph = phase12()
    layout = next(lay for _, lay in ph.mix if lay.kind == "distractors")
    return dataclasses.replace(ph, mix=((1.0, layout),))


def test_phase12_is_a_trial_run_alone_from_given_weights_with_the_stated_shares():
    ph = assert_trial_phase(12, curriculum.DISTRACTOR_STEPS, 3e-4)
    assert ph is phase12()
    # 40% distractor-chunked answers, 5% copy, 15% dense, 15% chunked, 12.5% + 12.5% query-only
    stated = {("answer", "distractor_chunked"): 0.40, ("answer", "copy"): 0.05, ("answer", "dense"): 0.15}
    stated |= {("answer", "chunked"): 0.15, ("query", "chunked"): 0.125, ("query", "no_needle"): 0.125}
    assert_shares(ph, 900, stated)


def test_phase14_is_phase12_with_number_strings_given_back_at_a_lower_peak():
    ph = assert_trial_phase(14, curriculum.DISTRACTOR2_STEPS, 2e-4)
    # 30% distractor-chunked answers, 10% copy, 25% dense, 15% chunked, 10% + 10% query-only
    stated = {("answer", "distractor_chunked"): 0.30, ("answer", "copy"): 0.10, ("answer", "dense"): 0.25}
    stated |= {("answer", "chunked"): 0.15, ("query", "chunked"): 0.10, ("query", "no_needle"): 0.10}
    assert_shares(ph, 900, stated)
    # number strings weighted up in every answer layout (phase 12: 60% of its distractor answers, 30% elsewhere)
    answer_layouts = [lay for _, lay in ph.mix if lay.kind in ("distractors", "dense", "chunked")]
    assert len(answer_layouts) == 3
    assert all(lay.tasks["number_string"] > max(w for t, w in lay.tasks.items() if t != "number_string")
               for lay in answer_layouts)  # fmt: skip


def test_phase15_is_phase14_with_its_chunked_answers_in_essays_and_pydoc_training_text():
    ph = assert_trial_phase(15, curriculum.PROSE_CHUNKED_STEPS, 2e-4)
    # 30% distractor-chunked answers, 10% copy, 15% dense, 25% chunked, 10% + 10% query-only
    stated = {("answer", "distractor_chunked"): 0.30, ("answer", "copy"): 0.10, ("answer", "dense"): 0.15}
    stated |= {("answer", "chunked"): 0.25, ("query", "chunked"): 0.10, ("query", "no_needle"): 0.10}
    assert_shares(ph, 900, stated)
    chunked = [lay for _, lay in ph.mix if lay.kind == "chunked"]
    assert len(chunked) == 1 and dict(chunked[0].haystacks) == {"essays": 0.5, "pydoc": 0.5}
    assert chunked[0].tasks["number_string"] == 0.6
    # plain chunked answers: no chunk beside the needle's is number-dense (the distractor layout's are)
    rng = random.Random(3)
    only = dataclasses.replace(ph, mix=((1.0, chunked[0]),))
    for _ in range(20):
        s, mode = draw_sample(rng, None, rng.randint(512, 1528), only)
        assert mode == "answer" and s.kind == "chunked"
        assert all(len(DIGITS.findall(c)) <= 3 for c in segments(s)), segments(s)


def test_the_needle_chunks_answer_is_the_learned_span_among_number_dense_chunks():
    rng = random.Random(7)
    places, counts, numbers = Counter(), Counter(), []
    samples = []
    for _ in range(150):
        s, mode = draw_sample(rng, None, rng.randint(512, 1528), only_distractors())
        assert mode == "answer" and s.kind == "distractor_chunked"
        answer, *eos = text([t for t, r in zip(s.ids, s.role) if r == "a"]).split("<2>")
        assert re.fullmatch(r"\d{5}|\d{10}", answer) and 1 <= len(eos) <= 12 and not any(eos)
        query = text([t for t, r in zip(s.ids, s.role) if r == "q"])
        assert not DIGITS.search(query)
        chunks = segments(s)
        holding = [i for i, c in enumerate(chunks) if any(answer in run for run in DIGITS.findall(c))]
        assert len(holding) == 1, (answer, chunks)  # the answer occurs in the needle's chunk only
        place = holding[0]
        assert DIGITS.findall(chunks[place]).count(answer) >= 1  # whole, not inside a longer number
        counts[len(chunks)] += 1
        places[(place == 0, place == len(chunks) - 1)] += 1
        numbers += [len(DIGITS.findall(c)) for i, c in enumerate(chunks) if i != place]
        samples.append(s)
    assert set(counts) <= {2, 3, 4, 5} and len(counts) >= 3
    # the needle's chunk first, last and in between
    assert places[(True, False)] and places[(False, True)] and places[(False, False)]
    assert sum(numbers) / len(numbers) >= 3  # the chunks beside the needle's are full of numbers
    # only the answer (and its EOS) is ever masked: the learned span
    gen = torch.Generator().manual_seed(0)
    batch = samples[:6]
    inputs, targets, weights, _pos, _attn = make_batch(batch, ["answer"] * len(batch), gen, 1536)
    for i, s in enumerate(batch):
        n = len(s.ids)
        is_answer = torch.tensor([r == "a" for r in s.role])
        assert (weights[i, :n] > 0).any() and not ((weights[i, :n] > 0) & ~is_answer).any()
        assert not ((inputs[i, :n] == 3) & ~is_answer).any()


def test_distractor_samples_hold_no_held_out_text(held_runs):
    from dllm.eval.tasks import make_case
    from dllm.eval.tasks.reports import make_report

    rng = random.Random(11)
    seen = set()
    for _ in range(200):
        s, _ = draw_sample(rng, None, rng.randint(512, 1528), only_distractors())
        body = text([t for t, r in zip(s.ids, s.role) if r in "pq"]).replace("<1>", " ")
        seen |= sources.word_runs(body)
    assert len(seen) > 10_000 and held_runs.isdisjoint(seen)
    # the check sees held-out text: an evaluation-split essay case, a register document
    leak = make_case("passkey", 3000, 0.5, 1, split="eval", haystack="essays", phrasing="random")
    assert not held_runs.isdisjoint(sources.word_runs(leak.context))
    register = make_report(4096, [("passkey", 0.5)], 3).context
    assert not held_runs.isdisjoint(sources.word_runs(register))


def test_sprinkle_and_crop_keep_text_at_word_and_sentence_boundaries():
    rng = random.Random(0)
    base = "alpha beta gamma. delta epsilon zeta. eta theta iota."
    out = distractors.sprinkle(rng, base, 3)
    assert DIGITS.search(out) and len(out) > len(base)
    assert [w for w in out.split() if w in base.split()] == base.split()  # every word kept, in order
    for _ in range(20):
        c = distractors.crop(rng, base * 5, 40, at_start=1.0)
        assert len(c) == 40 and c[0] in "ade"  # a sentence start: alpha, delta or eta
