"""split_s_attention vs the torch reference and vs dense attention over the concatenated keys."""

from __future__ import annotations

import math

import pytest
import torch

from triton_kernels import reference as R
from triton_kernels import split_s_attention
from triton_kernels.plan import H200, assume_gpu, plan_split_s
from triton_kernels.split_s import split_s_launch

from ._helpers import DEVICE, assert_rule, dtype_params, max_err, randn, split_s_dense

HKV = 2


def _case(b, m, g, d, t, slots, lens, dtype, live=True, seed=0, p=5):
    gen = torch.Generator().manual_seed(seed)
    q = randn(b, m, g * HKV, d, dtype=dtype, gen=gen)
    k_pool = randn(p, t, HKV, d, dtype=dtype, gen=gen)
    v_pool = randn(p, t, HKV, d, dtype=dtype, gen=gen)
    k_live = randn(b, m, HKV, d, dtype=dtype, gen=gen) if live else None
    v_live = randn(b, m, HKV, d, dtype=dtype, gen=gen) if live else None
    seg_slots = torch.tensor(slots, dtype=torch.int32, device=DEVICE).reshape(b, -1)
    seg_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE).reshape(b, -1)
    return q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live


def _check(args, out, lse, dtype, scale, live_lens=None):
    """Kernel vs the torch reference (fp32), under the rule; the reference vs dense attention."""
    f32 = [a.float() if a is not None and a.is_floating_point() else a for a in args]
    ref_o, ref_lse = R.split_s_attention(*f32, sm_scale=scale, live_lens=live_lens)
    dense_o, dense_lse = split_s_dense(*f32, scale, torch.float32, live_lens)
    low_o, low_lse = split_s_dense(*args, scale, dtype, live_lens)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert max_err(ref_o, dense_o) <= 1e-5 and max_err(ref_lse, dense_lse) <= 1e-5  # the two references agree
    assert_rule(out, ref_o, low_o, dtype, "out")
    assert_rule(lse, ref_lse, low_lse, dtype, "lse")


# Three batch rows with different segment counts (-1 = none), lengths 0, 1, T, tails.
T = 70
SLOTS = [[0, 2, -1], [3, -1, -1], [1, 4, 0]]
LENS = [[T, 1, 0], [0, 0, 0], [T - 3, 17, 0]]


@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize(
    "m,g,d",
    [(1, 1, 64), (17, 7, 64), (33, 4, 128), (17, 1, 128), (1, 7, 128), (33, 7, 64)],
    ids=lambda x: str(x),
)
def test_matches_references(m, g, d, dtype):
    args = _case(3, m, g, d, T, SLOTS, LENS, dtype, seed=m * 10 + g)
    scale = 1 / math.sqrt(d)
    out, lse = split_s_attention(*args, backend="triton")
    _check(args, out, lse, dtype, scale)


@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize(
    "plan",
    [
        dict(split_len=64),
        dict(segs_per_prog=2),
        dict(segs_per_prog=3),
        dict(block_m=16, block_n=16, split_len=32),
    ],
    ids=["split", "2-segs-per-prog", "3-segs-per-prog", "small-tiles"],
)
def test_partial_plans_agree(plan, dtype):
    """Splitting long segments / walking several segments per program changes nothing."""
    args = _case(3, 17, 7, 64, T, SLOTS, LENS, dtype, seed=5)
    scale = 0.3  # a non-default scale on the way
    out, lse = split_s_launch(*args, scale, **plan)
    _check(args, out, lse, dtype, scale)


def test_rows_without_keys():
    """A row with no valid key: out = 0, lse = -inf, no NaN (with and without other rows)."""
    args = _case(3, 5, 4, 64, T, [[-1, 2], [0, 1], [3, -1]], [[9, 0], [0, 0], [0, 4]], torch.float32, live=False)
    out, lse = split_s_attention(*args, backend="triton")
    assert not torch.isnan(out).any()
    assert torch.all(out[:2] == 0) and torch.all(lse[:2] == float("-inf"))
    _check(args, out, lse, torch.float32, 1 / 8)
    # No segment columns at all, no live block.
    q, kp, vp, _, _, _, _ = args
    empty = torch.zeros(3, 0, dtype=torch.int32, device=DEVICE)
    out, lse = split_s_attention(q, kp, vp, empty, empty, backend="triton")
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))


def test_live_block_only_and_single_partial():
    """S = 0 with live keys (one partial: phase 2 skipped) and one segment without live keys."""
    args = _case(2, 17, 7, 64, T, [[], []], [[], []], torch.float16)
    out, lse = split_s_attention(*args, backend="triton")
    _check(args, out, lse, torch.float16, 1 / 8)
    args = _case(2, 1, 4, 64, T, [[1], [0]], [[T], [1]], torch.float32, live=False)
    out, lse = split_s_attention(*args, backend="triton")
    _check(args, out, lse, torch.float32, 1 / 8)


def test_strided_inputs_and_int64_tables():
    """q/k/v as views of fused buffers (only the last dim contiguous); int64 segment tables."""
    gen = torch.Generator().manual_seed(11)
    b, m, g, d = 2, 9, 4, 64
    qkv = randn(b, m, g * HKV + 2 * HKV, 2, d, gen=gen)  # fused projection, an extra interleaved dim
    q = qkv[:, :, : g * HKV, 0]
    k_live, v_live = qkv[:, :, g * HKV : g * HKV + HKV, 1], qkv[:, :, g * HKV + HKV :, 1]
    pool = randn(4, T, 2 * HKV, d, gen=gen)
    k_pool, v_pool = pool[:, :, :HKV], pool[:, :, HKV:]
    slots = torch.tensor([[2, 0], [1, -1]], device=DEVICE)
    lens = torch.tensor([[T, 33], [64, 0]], device=DEVICE)
    args = (q, k_pool, v_pool, slots, lens, k_live, v_live)
    assert not q.is_contiguous() and not k_pool.is_contiguous()
    out, lse = split_s_attention(*args, backend="triton")
    _check(args, out, lse, torch.float32, 1 / 8)


def test_torch_backend_matches_the_reference():
    """backend="torch": the fused CPU path on CPU (tests/kernels/test_split_s_cpu.py), the reference elsewhere."""
    args = _case(3, 5, 7, 64, T, SLOTS, LENS, torch.float32)
    out, lse = split_s_attention(*args, backend="torch")
    ref_o, ref_lse = R.split_s_attention(*args)
    assert max_err(out, ref_o) <= 1e-5 and max_err(lse, ref_lse) <= 1e-5


# ----------------------------------------------------------------------------- ragged live blocks

RAGGED_SLOTS = [[0, 2], [3, -1], [-1, -1], [1, 4]]
RAGGED_LENS = [[T, 9], [33, 0], [0, 0], [T - 3, 1]]
LIVE_LENS = [17, 5, 0, 1]  # full, short, empty (no live token at all), one token


@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize(
    "plan", [{}, dict(split_len=64), dict(segs_per_prog=2)], ids=["default", "split", "2-segs-per-prog"]
)
def test_live_lens_ragged_rows(plan, dtype):
    """Ragged live blocks padded to M = 17: padded keys are masked for every row, padded query rows
    give 0 / -inf; garbage (NaN, 1e4) in the padding changes nothing."""
    args = list(_case(4, 17, 7, 64, T, RAGGED_SLOTS, RAGGED_LENS, dtype, seed=21))
    live_lens = torch.tensor(LIVE_LENS, dtype=torch.int32, device=DEVICE)
    scale = 1 / 8
    out, lse = split_s_launch(*args, scale, live_lens, **plan)
    _check(args, out, lse, dtype, scale, live_lens)
    for b, n in enumerate(LIVE_LENS):
        assert torch.all(out[b, n:] == 0) and torch.all(lse[b, n:] == float("-inf"))
    assert torch.isfinite(lse[0]).all() and torch.isfinite(lse[2, :0]).all()
    # Poison the padding: queries NaN, live keys huge (they would dominate every softmax), values NaN.
    q, kp, vp, slots, lens, kl, vl = (a.clone() if a is not None else a for a in args)
    for b, n in enumerate(LIVE_LENS):
        q[b, n:] = float("nan")
        kl[b, n:] = 1e4
        vl[b, n:] = float("nan")
    out2, lse2 = split_s_launch(q, kp, vp, slots, lens, kl, vl, scale, live_lens, **plan)
    assert torch.equal(out2, out) and torch.equal(lse2, lse)


def test_live_lens_without_live_keys_and_torch_backend():
    """live_lens also marks the real query rows when there are no live keys; both backends agree."""
    args = _case(4, 9, 4, 64, T, RAGGED_SLOTS, RAGGED_LENS, torch.float32, live=False, seed=4)
    live_lens = torch.tensor([9, 0, 3, 1], dtype=torch.int64, device=DEVICE)
    out, lse = split_s_attention(*args, live_lens=live_lens, backend="triton")
    _check(args, out, lse, torch.float32, 1 / 8, live_lens)
    ref_o, ref_lse = split_s_attention(*args, live_lens=live_lens, backend="torch")
    assert max_err(out, ref_o) <= 1e-5 and max_err(lse, ref_lse) <= 1e-5
    assert torch.all(out[1] == 0) and torch.all(out[2, 3:] == 0) and torch.all(lse[3, 1:] == float("-inf"))


# ----------------------------------------------------------------------------- the GPU plan, interpreted


def test_h200_plan_splits_and_folds_the_live_block():
    """The plan a 132-SM H200 chooses at a small shape (segments split, live block folded into the
    last partial, merge of the partials) gives the reference result through the interpreter."""
    b, m, hkv, g, d, t = 2, 4, 1, 2, 16, 512
    gen = torch.Generator().manual_seed(8)
    q = randn(b, m, g * hkv, d, gen=gen)
    kp, vp = randn(3, t, hkv, d, gen=gen), randn(3, t, hkv, d, gen=gen)
    kl, vl = randn(b, m, hkv, d, gen=gen), randn(b, m, hkv, d, gen=gen)
    slots = torch.tensor([[1, 0], [2, -1]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([[t, 300], [200, 0]], dtype=torch.int32, device=DEVICE)
    live_lens = torch.tensor([4, 1], dtype=torch.int32, device=DEVICE)
    plan = plan_split_s(b, m, g * hkv, hkv, d, 2, t, True, 4, H200)
    assert plan.n_splits > 1 and plan.n_parts == 2 * plan.n_splits and plan.merge is not None
    args = (q, kp, vp, slots, lens, kl, vl)
    with assume_gpu(H200):
        out, lse = split_s_attention(*args, live_lens=live_lens, backend="triton")
    _check(args, out, lse, torch.float32, 1 / 4, live_lens)


# ----------------------------------------------------------------------------- paging


@pytest.mark.parametrize("dtype", dtype_params())
def test_paging_changes_only_rounding(dtype):
    """The same 192 keys in 1, 3, 3 ragged or 12 segments (pools of other slot sizes, slots out of
    table order): the Triton kernel's summation order follows the segment table, so the results
    differ, but by at most eps(dtype) * max|v| in out (measured: <= 0.44 of it in fp32, 0.06 in
    fp16) and 4 fp32 ulps in lse; the torch path concatenates the keys first: equal bits."""
    n_keys, hkv, g, d, m = 192, 2, 2, 64, 4
    gen = torch.Generator().manual_seed(13)
    q, kl, vl = randn(1, m, hkv * g, d, gen=gen), randn(1, m, hkv, d, gen=gen), randn(1, m, hkv, d, gen=gen)
    k, v = randn(n_keys, hkv, d, gen=gen), randn(n_keys, hkv, d, gen=gen)
    q, kl, vl, k, v = (x.to(dtype) for x in (q, kl, vl, k, v))
    vmax = float(torch.cat([v, vl[0]]).abs().max())

    def paged(lens, t):
        kp = torch.full((len(lens) + 1, t, hkv, d), 1e4, dtype=dtype, device=DEVICE)  # junk past the lengths
        vp = torch.full_like(kp, float("nan"))
        start = 0
        for i, n in enumerate(lens):  # piece i in slot i + 1
            kp[i + 1, :n], vp[i + 1, :n] = k[start : start + n], v[start : start + n]
            start += n
        slots = torch.arange(1, len(lens) + 1, dtype=torch.int32, device=DEVICE)[None]
        return kp, vp, slots, torch.tensor([lens], dtype=torch.int32, device=DEVICE)

    layouts = [([192], 192), ([64, 64, 64], 64), ([70, 50, 72], 80), ([16] * 12, 16)]
    eps32 = torch.finfo(torch.float32).eps
    for backend in ("triton", "torch"):
        (o0, l0), *rest = (split_s_attention(q, *paged(lens, t), kl, vl, backend=backend) for lens, t in layouts)
        for o, lse in rest:
            if backend == "torch":
                assert torch.equal(o, o0) and torch.equal(lse, l0)
                continue
            assert max_err(o, o0) <= torch.finfo(dtype).eps * vmax
            assert max_err(lse, l0) <= 4 * eps32 * float(l0.abs().max())
