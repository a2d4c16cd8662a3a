"""Launch plans on the fake H200 / A100: the cost model's promises, and every partition covers every key once."""

from __future__ import annotations

import pytest
import torch

from triton_kernels import plan as P
from triton_kernels.plan import (
    A100,
    CTAS_PER_SM,
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
    """The paper's configuration: 8 partials (each segment split in two), 224 CTAs = 1-2 per SM of 132,
    and the cost model's time recomputed by hand from its constants (predicted, <= the 20 us target)."""
    plan = plan_split_s(1, 64, 28, 4, 128, 4, 1024, True, BF16, H200)
    assert plan.kv_bytes == 2 * (4 * 1024 + 64) * 4 * 128 * BF16
    assert (plan.n_parts, plan.split_len, plan.grid) == (8, 512, (28, 8, 1))
    assert H200.sm_count <= plan.ctas <= 2 * H200.sm_count
    assert plan.merge is not None and plan.merge.ctas >= H200.sm_count
    peak_sm = 989e12 / 132
    flops_cta = 4 * 64 * (512 + 64) * 128  # padded rows x (its half segment + the live block) x D
    compute = 1e6 * 2 * flops_cta / (peak_sm * P.ATTN_EFF_2) + P.CTA_ROUND_US  # 2 CTAs on the busiest SM
    io = 2 * (4 * 1024 + 64) * 4 * 128 * 2 + 2 * 64 * 28 * 128 * 2
    mem = 1e6 * io / (P.HBM_SHARE * 4.8e12)
    partials = 8 * 2 * 64 * 28 * 129 * 4
    merge = P.LAUNCH_US + 1e6 * partials / (P.HBM_SHARE * 4.8e12 * P.L2_OVER_HBM) + P.CTA_ROUND_US
    assert plan.predicted_us == pytest.approx(P.LAUNCH_US + max(compute, mem) + merge)
    assert plan.predicted_us <= 20.0


def test_c256_plans_more_than_one_cta_per_sm_quarter():
    """C = 256 (the bundled default) planned 28 CTAs under the former fixed caps; now about one per SM."""
    plan = plan_split_s(1, 64, 28, 4, 128, 4, 256, True, BF16, H200)
    assert plan.ctas >= 0.8 * H200.sm_count and plan.n_parts >= 4


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
    # only tile configs whose occupancy the compile gate measured (no spill, the CTAs/SM it assumes)
    assert ("split_s", gpu.arch, plan.block_m, plan.block_d, BF16) in CTAS_PER_SM
    # the model never predicts faster than the roofline of the same work (tensor peak, HBM)
    keys = k * c + m
    assert plan.predicted_us * 1e-6 >= max(
        4 * m * hq * keys * 128 / gpu.mma_flops_s, 2 * keys * hkv * 128 * BF16 / gpu.hbm_bytes_s
    )
    if plan.n_parts > 1:
        assert plan.merge is not None and plan.merge.n_unroll == min(plan.n_parts, 16)
        assert plan.merge.ctas >= gpu.sm_count or plan.merge.block_r == 1
    # the chosen partition is predicted no slower than one partial per segment (the former plan at C=256)
    base = plan_split_s(1, m, hq, hkv, 128, k, c, True, BF16, gpu, segs_per_prog=1)
    assert plan.predicted_us <= base.predicted_us + 1e-9
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


def test_hbm_rate_grows_with_ctas_and_saturates():
    rates = [P.hbm_rate(n, H200, 2) for n in (1, 16, 64, 132, 264, 1000)]
    assert rates == sorted(rates) and rates[0] > 0
    assert rates[-1] == pytest.approx(P.HBM_SHARE * H200.hbm_bytes_s)
