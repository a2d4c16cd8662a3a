"""Adaptive K: the chunks above the first drop of at least `margin` robust spreads, between a
floor and a ceiling (dllm.prefilling.selection.adaptive_top_k, PrefillingConfig.adaptive_k)."""

import math
import statistics

import pytest
import torch

from dllm.prefilling import PrefillingConfig
from dllm.prefilling.selection import adaptive_top_k, kept_chunks, kept_count, select_chunks


def reference_k(scores, floor, ceiling, margin):
    """The rule written out on plain floats: robust spread = 1.4826 x median absolute deviation (lower middle
    values; 1.2533 x the mean absolute deviation when that is 0), K = the first rank in [floor, ceiling)
    followed by a drop >= margin x spread, else the ceiling."""
    s = sorted((x for x in scores if math.isfinite(x)), reverse=True)
    if not s:
        return 1
    med = statistics.median_low(s)
    dev = [abs(x - med) for x in s]
    sigma = 1.4826 * statistics.median_low(dev) or 1.2533 * statistics.fmean(dev)  # MAD 0: the mean deviation
    lo, hi = min(floor, len(s)), min(ceiling, len(s))
    for k in range(lo, hi):
        if sigma > 0 and s[k - 1] - s[k] >= margin * sigma:
            return k
    return hi


def reference_kept(scores, ceiling, margin):
    """The kept chunks written out: the reference_k best (floor 1), and when fewer than the ceiling, the
    better-scoring finite neighbour of the best chunk (ties: the earlier one) if it is among the ceiling's best,
    ascending."""
    finite = [j for j, x in enumerate(scores) if math.isfinite(x)]
    order = sorted(finite, key=lambda j: (-scores[j], j))
    k = reference_k(scores, 1, ceiling, margin)
    kept = set(order[:k])
    if k < ceiling:
        near = [j for j in (order[0] - 1, order[0] + 1) if j in finite]
        if near and (j := sorted(near, key=lambda j: (-scores[j], j))[0]) in order[:ceiling]:
            kept.add(j)
    return sorted(kept)


# hand-made score vectors and the chunks a reader keeps by eye
CASES = [
    # one chunk far above a flat rest: keep it alone
    ([0.0, 0.1, -0.1, 9.0, 0.05, -0.05, 0.02, 0.03], 1, 8, 2.0, [3]),
    # two chunks close together far above the rest: keep both (the drop between them is small)
    ([0.0, 0.1, -0.1, 0.05, -0.05, 0.02, 5.0, 4.9, 0.03], 1, 8, 2.0, [6, 7]),
    # nothing stands out: the ceiling
    ([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9], 1, 4, 2.0, [6, 7, 8, 9]),
    # a floor of 2 keeps the runner-up with the clear winner (no large drop from rank 2 on: the ceiling 3)
    ([0.0, 0.1, -0.1, 9.0, 0.05, -0.05, 0.02, 0.03], 2, 3, 2.0, [1, 3, 4]),
    # chunks a first stage left out (-inf) and a NaN are no candidates and do not widen the spread
    ([float("-inf"), 0.0, 0.1, float("nan"), -0.1, 7.0, 0.05, float("-inf")], 1, 6, 2.0, [5]),
    # all scores equal: no spread, the ceiling
    ([1.0] * 6, 1, 3, 2.0, [0, 1, 2]),
    # most chunks tie (repeated filler) and one stands out: MAD 0, the mean deviation ((12.97 + 0.82 + 0.52) / 41
    # x 1.2533 = 0.44) finds its drop of 12.15; before, MAD 0 meant the ceiling (41 of 41 chunks kept)
    ([-0.3181] * 38 + [12.65, 0.5, 0.2], 1, 41, 1.5, [38]),
    # two chunks: MAD is always 0; the mean deviation is half their gap x 1.2533, so margin 1.5 keeps the best
    ([7.07, -0.43], 1, 2, 1.5, [0]),
]


@pytest.mark.parametrize("scores, floor, ceiling, margin, kept", CASES)
def test_kept_sets_on_hand_made_scores(scores, floor, ceiling, margin, kept):
    t = torch.tensor(scores)
    k = adaptive_top_k(t, floor, ceiling, margin)
    assert k == reference_k(scores, floor, ceiling, margin) == len(kept)
    assert select_chunks(t, k) == kept


def test_a_larger_margin_never_cuts_earlier_and_the_bounds_hold():
    g = torch.Generator().manual_seed(0)
    for trial in range(40):
        n = 3 + trial % 30
        s = torch.randn(n, generator=g)
        s[torch.randint(n, (2,), generator=g)] += 6.0 * (trial % 3)  # zero, one or two standouts
        prev = 0
        for m in (0.5, 1.0, 2.0, 4.0, 8.0):
            k = adaptive_top_k(s, 1, 8, m)
            assert k == reference_k(s.tolist(), 1, 8, m)
            assert 1 <= k <= min(8, n) and k >= prev
            prev = k


def test_kept_count_is_fixed_k_without_a_margin():
    s = torch.tensor([0.0, 9.0, 0.1, 0.2])
    assert kept_count(s, 3, None) == 3
    assert kept_count(s, 3, 2.0) == 1


@pytest.mark.parametrize(
    "floor, ceiling, margin, match",
    [(0, 4, 2.0, "floor"), (3, 2, 2.0, "floor"), (1, 4, 0.0, "margin"), (1, 4, float("nan"), "margin")],
)
def test_bad_arguments(floor, ceiling, margin, match):
    with pytest.raises(ValueError, match=match):
        adaptive_top_k(torch.zeros(4), floor, ceiling, margin)
    with pytest.raises(ValueError, match="at least one"):
        adaptive_top_k(torch.zeros(0), 1, 2, 1.0)


def test_config_field_is_validated():
    assert PrefillingConfig().adaptive_k is None
    assert PrefillingConfig(adaptive_k=2).adaptive_k == 2.0
    for bad in (0, -1.0, float("nan"), float("inf"), True, "2"):
        with pytest.raises(ValueError, match="adaptive_k"):
            PrefillingConfig(adaptive_k=bad)


def test_generate_keeps_the_adaptive_count_of_its_own_scores():
    """End to end with the bundled model: the kept chunks are the top adaptive_top_k(all scores) of the ceiling."""
    from dllm import generate, load_model
    from dllm.eval.evaluation import case_inputs
    from dllm.eval.tasks import make_case

    model = load_model()
    case = make_case("passkey", 1000, 0.5, 0)
    cfg = PrefillingConfig.from_pretrained(model.model_dir, chunk_size=128, top_k=4, adaptive_k=2.0)
    res = generate(model, **case_inputs(model, case, "prefilling"), method="prefilling", gen_length=2, prefilling=cfg)
    scores = torch.tensor(res.stats.extra["all_chunk_scores"])
    k = adaptive_top_k(scores, 1, 4, 2.0)
    assert scores.numel() > 4 and k < 4  # a case where the rule cuts below the ceiling
    assert res.stats.extra["selected_chunks"] == reference_kept(scores.tolist(), 4, 2.0)


@pytest.mark.parametrize("top_k", [None, "N"])
def test_adaptive_k_applies_when_k_covers_every_chunk(top_k):
    """top_k None (all chunks) or N is the ceiling: the chunks are still scored and K chosen between 1 and N
    (before, scoring was skipped and every chunk kept: --top-k all --adaptive-k 1.5 kept 114 of 114)."""
    from dllm import generate, load_model
    from dllm.eval.evaluation import case_inputs
    from dllm.eval.tasks import make_case

    model = load_model()
    case = make_case("passkey", 1000, 0.5, 0)
    inputs = case_inputs(model, case, "prefilling")
    base = PrefillingConfig.from_pretrained(model.model_dir, chunk_size=128, top_k=None, adaptive_k=2.0)
    n = len(
        generate(model, **inputs, method="prefilling", gen_length=2, prefilling=base).stats.extra["all_chunk_scores"]
    )
    cfg = (
        base
        if top_k is None
        else PrefillingConfig.from_pretrained(model.model_dir, chunk_size=128, top_k=n, adaptive_k=2.0)
    )
    res = generate(model, **inputs, method="prefilling", gen_length=2, prefilling=cfg)
    scores = torch.tensor(res.stats.extra["all_chunk_scores"])
    assert scores.numel() == n > 4 and bool(torch.isfinite(scores).all())
    k = adaptive_top_k(scores, 1, n, 2.0)
    assert k < n  # the rule cut: not every chunk kept
    assert res.stats.extra["selected_chunks"] == reference_kept(scores.tolist(), n, 2.0)


NEIGHBOUR_CASES = [
    # one chunk stands out: it and its better neighbour (chunk 4: 0.05 > chunk 2: -0.1)
    ([0.0, 0.1, -0.1, 9.0, 0.05, -0.05, 0.02, 0.03], 8, [3, 4]),
    # the best chunk is first: its only neighbour
    ([9.0, 0.1, 0.3, 0.2, 0.0], 4, [0, 1]),
    # the neighbour is already kept (two standouts side by side): nothing added
    ([0.0, 0.1, -0.1, 0.05, -0.05, 0.02, 5.0, 4.9, 0.03], 8, [6, 7]),
    # the ceiling reached: no neighbour (K never exceeds the ceiling)
    ([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9], 4, [6, 7, 8, 9]),
    # a neighbour the first stage left out (-inf) is no candidate: the other one
    ([0.0, 0.2, 0.1, 9.0, float("-inf"), 0.05, -0.1, 0.02], 8, [2, 3]),
    # equal neighbours: the earlier one
    ([0.0, 0.1, 0.3, 9.0, 0.3, 0.02, -0.1, 0.05], 8, [2, 3]),
    # the better neighbour (chunk 2: 0.4) is not among the 3 best (3, 6, 1): a plain distractor, left out
    ([0.0, 0.5, 0.4, 9.0, 0.1, 0.3, 0.6, 0.2], 3, [3]),
    # ... but among the 4 best it is the fact's other half, kept
    ([0.0, 0.5, 0.4, 9.0, 0.1, 0.3, 0.6, 0.2], 4, [2, 3]),
]


@pytest.mark.parametrize("scores, ceiling, kept", NEIGHBOUR_CASES)
def test_adaptive_kept_chunks_bring_the_best_chunks_neighbour(scores, ceiling, kept):
    """A fact straddling a boundary lies in two chunks, both scored high: the lost-in-the-middle pass key whose
    second sentence alone was kept read '13388' for 32388 (bench/results/adaptive_k.md). A neighbour outside the
    ceiling's best is a distractor beside the fact (bench/results/copy_levers/neighbour_rules/)."""
    t = torch.tensor(scores)
    assert kept_chunks(t, ceiling, 2.0) == reference_kept(scores, ceiling, 2.0) == kept
    assert kept_chunks(t, ceiling, None) == select_chunks(t, ceiling)  # fixed K: the paper's top-K
