"""The tiny model's training samples and batches (bench/tiny): layouts, roles and masks.

Expected values come from the sample definitions in bench/tiny/data.py's docstring, checked by
decoding the character ids back to text, not from the code paths that build them.
"""

import dataclasses
import random
from collections import Counter

import torch

from bench.tiny import data
from bench.tiny.tokenizer import CHARS
from bench.tiny.train import FINE_TUNE_MIX, fine_tune_sample, make_batch


def text(ids):
    return "".join(CHARS[i - 4] if i >= 4 else f"<{i}>" for i in ids)


def part(s, role):
    return [t for t, r in zip(s.ids, s.role) if r == role]


def test_copy_sample_answer_is_the_context():
    for seed in range(5):
        s = data.copy_sample(random.Random(seed), 120)
        ctx, ans = part(s, "p"), part(s, "a")
        assert s.ids[0] == data.BOS and ans[-1] == data.EOS
        assert ans[:-1] == ctx and len(ctx) == 58  # (120 - 4) // 2
        assert text(part(s, "q")) == "\n\n"
        assert set(s.segment) == {0}


def test_copy_sample_digit_pool_holds_digits_only():
    s = data.copy_sample(random.Random(3), 200, pool="0123456789")
    ctx, ans = text(part(s, "p")), part(s, "a")
    assert len(ctx) == 98 and set(ctx) == set("0123456789")  # (200 - 4) // 2 characters, all ten digits
    assert text(ans[:-1]) == ctx and ans[-1] == data.EOS


def test_phase7_copy_strings_come_from_the_weighted_pools():
    mix = dataclasses.replace(FINE_TUNE_MIX[7], copy=1.0)  # every draw a copy string
    rng = random.Random(0)
    kinds = Counter()
    for _ in range(600):
        s, mode = fine_tune_sample(rng, 200, mix)
        ctx = set(text(part(s, "p")))
        assert mode == "answer" and text(part(s, "a")[:-1]) == text(part(s, "p"))
        # 98 characters: a hex string always holds a letter a-f or a dash, a COPY_POOL one a g-z or space
        kinds["digits" if ctx <= set("0123456789") else "hex" if ctx <= set("0123456789abcdef-") else "mixed"] += 1
    # weights 0.5 / 0.25 / 0.25; 600 draws: 3 standard deviations are ~0.06 and ~0.05
    assert abs(kinds["hex"] / 600 - 0.5) < 0.07
    assert abs(kinds["digits"] / 600 - 0.25) < 0.06 and abs(kinds["mixed"] / 600 - 0.25) < 0.06


def test_phase8_trial_draws_no_copy_strings_and_the_stated_layout_shares():
    rng = random.Random(1)
    kinds = Counter()
    for _ in range(400):
        s, mode = fine_tune_sample(rng, 400, FINE_TUNE_MIX[8])
        kinds["query" if mode == "query" else s.kind] += 1
    # 0% copy, 55% dense, 30% chunked, 15% query-only; 400 draws: 3 standard deviations are <= 0.075
    assert kinds["copy"] == 0
    assert abs(kinds["dense"] / 400 - 0.55) < 0.075 and abs(kinds["chunked"] / 400 - 0.30) < 0.07
    assert abs(kinds["query"] / 400 - 0.15) < 0.055


def test_chunked_sample_without_answer_ends_at_the_query_and_keeps_the_needle():
    rng = random.Random(3)
    for _ in range(10):
        s = data.chunked_sample(rng, 600, "passkey", answer=False)
        assert "a" not in s.role
        assert s.role[-1] == "q" and s.segment[-1] == 0
        static = text([t for t, g in zip(s.ids, s.segment) if g > 0])
        assert "pass key" in static or "passkey" in static.replace(" ", "")
        # every static segment opens with its own BOS
        starts = [i for i in range(len(s.ids)) if s.segment[i] > 0 and (i == 0 or s.segment[i - 1] != s.segment[i])]
        assert all(s.ids[i] == data.BOS for i in starts)


def test_needle_free_chunks_hold_no_key():
    rng = random.Random(4)
    for _ in range(10):
        s = data.chunked_sample(rng, 600, "passkey", drop_needle=True, answer=False)
        static = text([t for t, g in zip(s.ids, s.segment) if g > 0 and t >= 4])
        assert len(static) >= 50 and not any(c.isdigit() for c in static)  # passkey filler has no digits


def test_make_batch_masks_only_eligible_tokens_and_isolates_segments():
    rng = random.Random(0)
    samples = [data.chunked_sample(rng, 400, "passkey", answer=False) for _ in range(4)]
    gen = torch.Generator().manual_seed(0)
    inputs, targets, weights, _pos, attn = make_batch(samples, ["query"] * 4, gen, 512, weighting="mean")
    for i, s in enumerate(samples):
        n = len(s.ids)
        q = torch.tensor([r == "q" for r in s.role])
        masked = inputs[i, :n] == data.MASK
        assert masked.any() and not (masked & ~q).any()  # only query tokens are ever masked
        assert torch.allclose(weights[i].sum(), torch.tensor(1.0))  # per-row mean
        seg = torch.tensor(s.segment)
        # a static row sees exactly its own segment; a live row sees every real token
        for r in (0, n - 1):
            want = (seg == seg[r]) if seg[r] > 0 else torch.ones(n, dtype=torch.bool)
            assert torch.equal(attn[i, r, :n], want) and not attn[i, r, n:].any()
    assert torch.equal(targets[0, : len(samples[0].ids)], torch.tensor(samples[0].ids))
