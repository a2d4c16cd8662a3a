"""bench.tiny.skill_probe: the batched one-pass answer probe against an unbatched recomputation."""

import math

import pytest
import torch
import torch.nn.functional as F

from bench.tiny import data
from bench.tiny.skill_probe import PROBES, answer_probe
from dllm.model.loader import load_model


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return load_model("dllm/assets/tiny-dream", device="cpu", dtype=torch.float32)


def _one_row(model, prompt, ans):
    """Unbatched, unpadded: per-token cross-entropy and hits of the fully masked answer."""
    ids = torch.tensor([prompt + [data.MASK] * len(ans)])
    with torch.no_grad():
        logits = model(ids, torch.arange(ids.shape[1])).logits[0, len(prompt) :].float()
    gold = torch.tensor(ans)
    return F.cross_entropy(logits, gold, reduction="none"), logits.argmax(-1) == gold


def test_answer_probe_matches_unbatched_rows(tiny):
    # rows of different lengths, so the batch is padded and the key-padding mask matters
    rows = [PROBES[0].make(7), PROBES[2].make(8), PROBES[5].make(9)]
    ce, acc = answer_probe(tiny, rows)
    per = [_one_row(tiny, p, a) for p, a in rows]
    want_ce = torch.cat([c for c, _ in per]).mean().item()
    want_acc = torch.cat([h for _, h in per]).float().mean().item()
    assert ce == pytest.approx(want_ce, rel=1e-4, abs=1e-5)
    assert acc == pytest.approx(want_acc, abs=1e-6)


def test_answer_probe_reads_a_skill_the_model_has(tiny):
    # passkey inside the window is 100% in the recorded dense evaluation: near-zero loss here
    ce, acc = answer_probe(tiny, [PROBES[0].make(900_000 + i) for i in range(4)])
    assert acc == 1.0 and ce < 0.1 < math.log(10)


def test_copy_probe_answer_is_the_context_string():
    prompt, ans = PROBES[5].make(3)
    assert len(ans) == 36 and prompt[0] == data.BOS
    assert prompt[1 : 1 + len(ans)] == ans and all(t in {data.CHAR_ID[c] for c in data.DIGIT_POOL} for t in ans)


def test_answer_probe_rejects_empty_input(tiny):
    with pytest.raises(ValueError, match="non-empty answer"):
        answer_probe(tiny, [])
    with pytest.raises(ValueError, match="non-empty answer"):
        answer_probe(tiny, [([data.BOS, 5], [])])


def test_uuid_chance_is_the_entropy_of_the_uuid_v4_layout():
    import random
    from collections import Counter

    from bench.tiny.skill_probe import UUID_CHANCE
    from dllm.eval.tasks.kv_retrieval import seeded_uuid

    rng = random.Random(0)
    uuids = [seeded_uuid(rng) for _ in range(4000)]
    entropy = 0.0  # per-position empirical entropy, averaged over the 36 characters
    for pos in range(36):
        counts = Counter(u[pos] for u in uuids)
        entropy -= sum(c / 4000 * math.log(c / 4000) for c in counts.values())
    assert UUID_CHANCE == pytest.approx(entropy / 36, abs=0.01)
