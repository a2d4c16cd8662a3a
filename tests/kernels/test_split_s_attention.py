"""split_s_attention vs the torch reference and vs dense attention over the concatenated keys."""

from __future__ import annotations

import math

import pytest
import torch

from triton_kernels import reference as R
from triton_kernels import split_s_attention
from triton_kernels.split_s import split_s_launch

from ._helpers import DEVICE, assert_rule, dtype_params, max_err, randn

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


def _dense(q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live, dtype, scale):
    """Dense attention per row over torch.cat of the row's valid keys, computed in ``dtype``."""
    outs, lses = [], []
    for b in range(q.shape[0]):
        ks = [k_pool[s, :n] for s, n in zip(seg_slots[b].tolist(), seg_lens[b].tolist(), strict=True) if s >= 0]
        vs = [v_pool[s, :n] for s, n in zip(seg_slots[b].tolist(), seg_lens[b].tolist(), strict=True) if s >= 0]
        if k_live is not None:
            ks.append(k_live[b])
            vs.append(v_live[b])
        k = torch.cat(ks) if ks else k_pool[0, :0]
        v = torch.cat(vs) if vs else v_pool[0, :0]
        o, lse = _dense_row(q[b], k, v, scale, dtype)
        outs.append(o)
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


def _dense_row(q, k, v, scale, dtype):
    from ._helpers import dense_attention

    return dense_attention(q, k, v, scale, dtype)


def _check(args, out, lse, dtype, scale):
    f32 = [a.float() if a is not None and a.is_floating_point() else a for a in args]
    ref_o, ref_lse = R.split_s_attention(*f32, sm_scale=scale)
    dense_o, dense_lse = _dense(*f32, torch.float32, scale)
    low_o, low_lse = _dense(*args, dtype, scale)
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


def test_torch_backend_is_the_reference():
    args = _case(3, 5, 7, 64, T, SLOTS, LENS, torch.float32)
    out, lse = split_s_attention(*args, backend="torch")
    ref_o, ref_lse = R.split_s_attention(*args)
    assert torch.equal(out, ref_o) and torch.equal(lse, ref_lse)
