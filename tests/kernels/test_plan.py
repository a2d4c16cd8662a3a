"""Launch plans on the fake H200 / A100: the cost model's promises, and every partition covers every key once."""

from __future__ import annotations

import pytest
import torch

from triton_kernels.plan import (
    A100,
    H200,
    INTERPRETER,
    MIN_SPLIT_TILES,
    assume_gpu,
    cdiv,
    ctas_per_sm,
    gpu_spec,
    next_pow2,
    plan_chunk_scores,
    plan_merge,
    plan_split_s,
    prev_pow2,
)

MODELS = {"dream7b": (28, 4), "llada8b": (32, 32)}  # (Hq, Hkv), D = 128
# Decode shapes of the compile gate: (K segments, C tokens each, M live tokens).
DECODE = [(4, 1024, 64), (4, 1024, 96), (4, 256, 64), (4, 256, 96), (16, 1024, 32), (64, 1024, 32)]
BF16 = 2


def _covered(plan, s: int, t: int) -> dict:
    """Walk the kernel's (partial -> segments, token range) mapping: how often each key is read."""
    seen: dict = {}
    for part in range(plan.n_parts):
        seg0 = (part // plan.n_splits) * plan.segs_per_prog
        lo = (part % plan.n_splits) * plan.split_len
        for j in range(plan.segs_per_prog):
            seg = seg0 + j
            if seg < s:
                for tok in range(lo, min(t, lo + plan.split_len)):
                    seen[(seg, tok)] = seen.get((seg, tok), 0) + 1
        if part == plan.n_parts - 1:
            seen["live"] = seen.get("live", 0) + 1
    return seen


def test_dream_decode_k4_c1024_m64_on_h200():
    """The issue's acceptance shape: partial traffic <= K/V bytes, merge grid >= 132 CTAs (or no merge)."""
    plan = plan_split_s(1, 64, 28, 4, 128, 4, 1024, True, BF16, H200)
    kv = 2 * (4 * 1024 + 64) * 4 * 128 * BF16
    assert plan.kv_bytes == kv
    assert plan.partial_bytes <= kv
    assert plan.merge is None or plan.merge.ctas >= H200.sm_count
    assert plan.n_parts == 4 and plan.ctas == 4 * 7 * 4  # one partial per segment, live folded in
    # The old heuristic (4 CTAs/SM) made 17 partials: 15.6 MB of fp32 partials against 8.4 MB of K/V.
    assert plan.n_parts * 64 * 28 * 129 * 4 * 2 <= kv


def test_joint_row_lse_on_h200_fills_the_machine():
    """Joint scoring (N = 1 chunk of 4096 keys, 64 scoring tokens): pass 1 split over the keys."""
    plan = plan_chunk_scores(1, 64, 28, 4, 128, 4096, BF16, H200)
    assert plan.lse_ctas >= H200.sm_count
    assert plan.split_len >= MIN_SPLIT_TILES * plan.block_n and plan.split_len % plan.block_n == 0
    assert plan.n_splits * plan.split_len >= 4096 > (plan.n_splits - 1) * plan.split_len
    # Many chunks already fill it: no split.
    assert plan_chunk_scores(16, 64, 28, 4, 128, 1024, BF16, H200).n_splits == 1


@pytest.mark.parametrize("gpu", [H200, A100], ids=["h200", "a100"])
@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("k,c,m", DECODE, ids=lambda x: str(x))
def test_decode_plans_keep_the_cost_model(k, c, m, model, gpu):
    hq, hkv = MODELS[model]
    plan = plan_split_s(1, m, hq, hkv, 128, k, c, True, BF16, gpu)
    assert plan.n_parts >= 1
    if plan.n_parts > 1:
        assert plan.partial_bytes <= plan.kv_bytes, "fp32 partial traffic over the K/V bytes"
        assert plan.ctas <= plan.wave, "more than one wave"
        assert plan.merge is not None and plan.merge.n_unroll == min(plan.n_parts, 16)
        assert plan.merge.ctas >= gpu.sm_count or plan.merge.block_r == 1
    if plan.n_splits > 1:
        assert plan.split_len >= MIN_SPLIT_TILES * plan.block_n
    seen = _covered(plan, k, c)
    assert seen.pop("live") == 1
    assert set(seen.values()) == {1} and len(seen) == k * c, "every key read exactly once"


@pytest.mark.parametrize(
    "override", [dict(split_len=64), dict(split_len=128), dict(segs_per_prog=2), dict(segs_per_prog=3)]
)
@pytest.mark.parametrize("s,t", [(3, 70), (5, 300), (1, 1)])
def test_forced_partitions_cover_every_key_once(s, t, override):
    plan = plan_split_s(2, 17, 14, 2, 64, s, t, True, 4, INTERPRETER, **override)
    seen = _covered(plan, s, t)
    assert seen.pop("live") == 1 and set(seen.values()) == {1} and len(seen) == s * t


def test_plan_overrides_are_checked():
    with pytest.raises(ValueError, match="multiple of BLOCK_N"):
        plan_split_s(1, 4, 2, 1, 64, 2, 100, True, 4, H200, split_len=50)
    with pytest.raises(ValueError, match="segs_per_prog"):
        plan_split_s(1, 4, 2, 1, 64, 2, 200, True, 4, H200, split_len=64, segs_per_prog=2)


def test_no_segments_and_no_live_block():
    assert plan_split_s(1, 8, 4, 2, 64, 0, 10, True, 2, H200).n_parts == 1
    assert plan_split_s(1, 8, 4, 2, 64, 0, 10, False, 2, H200).n_parts == 0


@pytest.mark.parametrize("n,rows", [(2, 1792), (4, 1792), (16, 896), (40, 5), (3, 1_000_000)])
def test_merge_plan(n, rows):
    plan = plan_merge(n, rows, 128, H200)
    assert plan.n_unroll == min(n, 16)
    assert plan.block_r * plan.block_d * plan.n_unroll <= 16384 and plan.block_r * plan.block_d <= 2048
    assert plan.ctas == cdiv(rows, plan.block_r)
    if rows >= H200.sm_count:
        assert plan.ctas >= H200.sm_count


def test_plans_are_memoised_and_assume_gpu_scopes():
    a = plan_split_s(1, 64, 28, 4, 128, 4, 1024, True, BF16, H200)
    assert plan_split_s(1, 64, 28, 4, 128, 4, 1024, True, BF16, H200) is a
    cpu = torch.device("cpu")
    assert gpu_spec(cpu) is INTERPRETER
    with assume_gpu(A100):
        assert gpu_spec(cpu) is A100
        with assume_gpu(H200):
            assert gpu_spec(cpu) is H200
        assert gpu_spec(cpu) is A100
    assert gpu_spec(cpu) is INTERPRETER


def test_occupancy_calculator():
    # 206 registers x 128 threads, 80 KB of shared memory: 2 CTAs on an H200 SM (registers bind first).
    assert ctas_per_sm(H200, 4, 206, 80 * 1024) == 2
    assert ctas_per_sm(H200, 4, 128, 48 * 1024) == 4  # shared memory binds: 228 KB / 49 KB
    assert ctas_per_sm(A100, 8, 255, 0) == 1  # 255 -> 256 registers x 256 threads = the whole file
    assert ctas_per_sm(H200, 1, 16, 0) == 32  # the CTA limit


def test_int_helpers():
    assert [next_pow2(x) for x in (0, 1, 2, 3, 64, 65)] == [1, 1, 2, 4, 64, 128]
    assert [prev_pow2(x) for x in (0, 1, 2, 3, 64, 65)] == [1, 1, 2, 2, 64, 64]
    assert [cdiv(a, 4) for a in (0, 1, 4, 5)] == [0, 1, 1, 2]
