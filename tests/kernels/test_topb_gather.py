"""topb_gather: exact agreement with the reference and the selection invariants."""

from __future__ import annotations

import pytest
import torch

from triton_kernels import reference as R
from triton_kernels import topb_gather

from ._helpers import DEVICE, dtype_params, randn

HKV, T, D = 3, 45, 64


def _inputs(dtype, seed, n=4):
    gen = torch.Generator().manual_seed(seed)
    scores = randn(n, HKV, T, gen=gen)
    k = randn(n, T, HKV, D, dtype=dtype, gen=gen)
    v = randn(n, T, HKV, D, dtype=dtype, gen=gen)
    return scores, k, v


@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("b", [1, 6, T, T + 3])
@pytest.mark.parametrize("use_lens", [False, True])
def test_matches_reference(b, use_lens, dtype):
    scores, k, v = _inputs(dtype, seed=b)
    lens = torch.tensor([T, 0, 1, 20], dtype=torch.int32, device=DEVICE) if use_lens else None
    got = topb_gather(scores, k, v, b, lens=lens, backend="triton")
    ref = R.topb_gather(scores, k, v, b, lens=lens)
    for name, x, y in zip(("k_out", "v_out", "idx", "kept"), got, ref, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert torch.equal(x, y), name


@pytest.mark.parametrize("pool_kernel", [1, 3, 7])
@pytest.mark.parametrize("keep_first", [True, False])
def test_invariants(pool_kernel, keep_first):
    scores, k, v = _inputs(torch.float32, seed=pool_kernel)
    lens = torch.tensor([T, 0, 1, 20], device=DEVICE)
    b = 8
    k_out, v_out, idx, kept = topb_gather(
        scores, k, v, b, lens=lens, pool_kernel=pool_kernel, keep_first=keep_first, backend="triton"
    )
    assert kept.tolist() == [8, 0, 1, 8] and kept.dtype == torch.int32
    pooled = R.pool_scores(scores, lens, pool_kernel=pool_kernel, keep_first=keep_first)
    for n in range(4):
        c = int(kept[n])
        assert torch.all(idx[n, :, c:] == -1) and torch.all(k_out[n, c:] == 0) and torch.all(v_out[n, c:] == 0)
        if c == 0:
            continue
        sel = idx[n, :, :c]  # [H, c]
        assert torch.all(sel[:, 1:] > sel[:, :-1]), "ascending, no duplicates"
        assert torch.all(sel < int(lens[n])), "only valid tokens"
        if keep_first:
            assert torch.all(sel[:, 0] == 0), "BOS kept"
        top_vals = torch.topk(pooled[n], c, dim=-1).values  # [H, c]
        got_vals = torch.gather(pooled[n], 1, sel).sort(dim=-1, descending=True).values
        assert torch.equal(got_vals, top_vals), "selected pooled values are the top-b values"
        for h in range(HKV):
            assert torch.equal(k_out[n, :c, h], k[n, sel[h], h]) and torch.equal(v_out[n, :c, h], v[n, sel[h], h])


def test_ties_go_to_lower_index():
    scores = torch.zeros(2, HKV, T, device=DEVICE)
    scores[1, :, 30:] = 1.0  # a plateau: all tied at the top
    k = randn(2, T, HKV, D)
    _, _, idx, _ = topb_gather(scores, k, k, 5, pool_kernel=1, keep_first=False, backend="triton")
    assert idx[0].tolist() == [[0, 1, 2, 3, 4]] * HKV
    assert idx[1].tolist() == [[30, 31, 32, 33, 34]] * HKV
    _, _, idx, _ = topb_gather(scores, k, k, 5, pool_kernel=1, keep_first=True, backend="triton")
    assert idx[1].tolist() == [[0, 30, 31, 32, 33]] * HKV


def test_strided_kv():
    gen = torch.Generator().manual_seed(2)
    kv = randn(3, T, 2 * HKV, D, gen=gen)
    k, v = kv[:, :, :HKV], kv[:, :, HKV:]
    scores = randn(3, HKV, T, gen=gen)
    got = topb_gather(scores, k, v, 7, backend="triton")
    ref = R.topb_gather(scores, k, v, 7)
    assert all(torch.equal(x, y) for x, y in zip(got, ref, strict=True))
