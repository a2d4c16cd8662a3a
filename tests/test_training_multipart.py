"""Phase 13's layout (bench/tiny/multipart.py): multi-part answers, each key copied from a chunk of its own.

Checked by decoding the character ids back to text: the answer is the task's gold answer for keys that each
occur in exactly one chunk, in the chunks' order, only the answer is masked, and no sample holds text of a
held-out source.
"""

import dataclasses
import random
import re
from collections import Counter

import torch

from bench.tiny import curriculum, sources
from bench.tiny.curriculum import PHASES, draw_sample
from bench.tiny.tokenizer import CHARS
from bench.tiny.train import make_batch
from dllm.eval.tasks.multipart import PREFIX, answer_text, part_scores
from tests.mix_shares import assert_shares, assert_trial_phase

KEY_SENTENCE = re.compile(r"pass key number (\d) is (\d{5})")


def text(ids):
    return "".join(CHARS[i - 4] if i >= 4 else f"<{i}>" for i in ids)


def phase13():
    return next(ph for ph in PHASES if any(lay.kind == "multipart" for _, lay in ph.mix))


def only(kind):
    ph = phase13()
    return dataclasses.replace(ph, mix=((1.0, next(lay for _, lay in ph.mix if lay.kind == kind)),))


def test_phase13_is_a_trial_run_alone_from_given_weights_with_the_stated_shares():
    ph = assert_trial_phase(13, curriculum.MULTIPART_STEPS, 5e-4)
    assert ph is phase13()
    # 45% chunked and 15% one-segment multi-part answers, 8% query-only beside the needle chunk
    stated = {("answer", "multipart"): 0.45, ("answer", "multipart_dense"): 0.15, ("query", "chunked"): 0.08}
    assert_shares(ph, 1000, stated)


def test_each_key_is_copied_from_one_chunk_in_order():
    rng = random.Random(3)
    parts, others = Counter(), []
    samples = []
    for _ in range(120):
        bucket = rng.choice(phase13().buckets)
        s, mode = draw_sample(rng, None, rng.randint(bucket // 2, bucket - 8), only("multipart"))
        assert mode == "answer" and s.kind == "multipart"
        answer, *eos = text([t for t, r in zip(s.ids, s.role) if r == "a"]).split("<2>")
        assert 1 <= len(eos) <= 8 and not any(eos)
        keys = [k for _, k in KEY_SENTENCE.findall(answer)]
        assert answer == answer_text(keys) and part_scores(answer, keys) == [True] * len(keys)
        chunks = {}
        for t, g in zip(s.ids, s.segment):
            if g > 0 and t >= 4:
                chunks[g] = chunks.get(g, "") + CHARS[t - 4]
        chunks = [c for _, c in sorted(chunks.items())]
        assert chunks[0] == PREFIX
        holding = [[i for i, c in enumerate(chunks) if k in c] for k in keys]
        assert all(len(h) == 1 for h in holding), (keys, chunks)  # each key in exactly one chunk
        assert [h[0] for h in holding] == sorted(h[0] for h in holding)  # first key first
        for (number, key), h in zip(KEY_SENTENCE.findall(answer), holding):
            assert f"pass key number {number} is {key}" in chunks[h[0]]  # under its own number
        parts[len(keys)] += 1
        others.append(len(chunks) - 1 - len(keys))
        samples.append(s)
        assert len(s.ids) <= bucket
    assert set(parts) == {2, 3, 4} and set(others) >= {0, 1, 2, 3}
    # only the answer (and its EOS) is ever masked
    gen = torch.Generator().manual_seed(0)
    batch = samples[:6]
    inputs, _targets, weights, _pos, _attn = make_batch(batch, ["answer"] * len(batch), gen, 1536)
    for i, s in enumerate(batch):
        n = len(s.ids)
        is_answer = torch.tensor([r == "a" for r in s.role])
        assert (weights[i, :n] > 0).any() and not ((weights[i, :n] > 0) & ~is_answer).any()


def test_the_one_segment_layout_holds_the_same_parts_in_one_live_segment():
    rng = random.Random(8)
    for _ in range(30):
        s, _ = draw_sample(rng, None, rng.randint(500, 1500), only("multipart_dense"))
        assert s.kind == "multipart_dense" and set(s.segment) == {0}
        prompt = text([t for t, r in zip(s.ids, s.role) if r == "p"])
        answer = text([t for t, r in zip(s.ids, s.role) if r == "a"]).split("<2>")[0]
        keys = [k for _, k in KEY_SENTENCE.findall(answer)]
        assert prompt.startswith(PREFIX) and [prompt.count(k) for k in keys] == [1] * len(keys)


def test_multipart_samples_hold_no_held_out_text(held_runs):
    rng = random.Random(11)
    seen = set()
    for _ in range(150):
        s, _ = draw_sample(rng, None, rng.randint(700, 1500), only(rng.choice(["multipart", "multipart_dense"])))
        seen |= sources.word_runs(text([t for t, r in zip(s.ids, s.role) if r in "pq"]).replace("<1>", " "))
    assert len(seen) > 5_000 and held_runs.isdisjoint(seen)
