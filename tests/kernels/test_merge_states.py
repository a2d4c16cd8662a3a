"""merge_states: -inf-safe LSE reduction; associativity, order independence, split == whole."""

from __future__ import annotations

import math

import pytest
import torch

from triton_kernels import merge_states
from triton_kernels import reference as R

from ._helpers import DEVICE, FLOOR, assert_rule, dtype_params, max_err, randn


def _partials(n, shape, h, d, dtype, gen, dead_frac=0.3):
    o = randn(n, *shape, h, d, dtype=dtype, gen=gen)
    lse = randn(n, *shape, h, gen=gen, scale=3.0)
    dead = torch.rand(n, *shape, h, generator=gen).to(DEVICE) < dead_frac
    lse = lse.masked_fill(dead, float("-inf"))
    o = o.masked_fill(dead[..., None], float("nan"))  # dead partials may hold anything
    return o, lse


@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize(
    "n,shape,h,d", [(1, (3,), 2, 64), (5, (2, 7), 3, 128), (9, (), 4, 80), (3, (33,), 7, 16), (37, (2,), 3, 32)]
)
def test_matches_reference(n, shape, h, d, dtype):
    gen = torch.Generator().manual_seed(n * 100 + d)
    o, lse = _partials(n, shape, h, d, dtype, gen)
    lse[:, ..., 0] = float("-inf")  # one head with no live partial at all
    out, out_lse = merge_states(o, lse, backend="triton")
    ref, ref_lse = R.merge_states(o.float(), lse)
    assert out.shape == o.shape[1:] and out.dtype == dtype
    assert out_lse.shape == lse.shape[1:] and out_lse.dtype == torch.float32
    assert not torch.isnan(out).any() and not torch.isnan(out_lse).any()
    assert torch.all(out[..., 0, :] == 0) and torch.all(out_lse[..., 0] == float("-inf"))
    low, _ = R.merge_states(o, lse)  # the torch reference rounding to dtype
    assert_rule(out, ref, low, dtype, "o")
    assert max_err(out_lse, ref_lse) <= 1e-5


def test_associative_and_order_independent():
    gen = torch.Generator().manual_seed(1)
    o, lse = _partials(6, (5,), 3, 64, torch.float32, gen)
    whole, whole_lse = merge_states(o, lse, backend="triton")
    left, left_lse = merge_states(o[:2], lse[:2], backend="triton")
    right, right_lse = merge_states(o[2:], lse[2:], backend="triton")
    nested, nested_lse = merge_states(torch.stack([left, right]), torch.stack([left_lse, right_lse]), backend="triton")
    perm = torch.randperm(6, generator=gen).to(DEVICE)
    shuffled, shuffled_lse = merge_states(o[perm], lse[perm], backend="triton")
    for a, la in ((nested, nested_lse), (shuffled, shuffled_lse)):
        assert max_err(a, whole) <= 1e-5
        assert max_err(la, whole_lse) <= 1e-5


@pytest.mark.parametrize("dtype", dtype_params())
def test_split_of_keys_equals_whole(dtype):
    """Merging attention over any partition of the keys == attention over all keys."""
    gen = torch.Generator().manual_seed(7)
    m, hq, hkv, d, n_keys = 17, 8, 2, 64, 93
    q = randn(m, hq, d, dtype=dtype, gen=gen)
    k = randn(n_keys, hkv, d, dtype=dtype, gen=gen)
    v = randn(n_keys, hkv, d, dtype=dtype, gen=gen)
    scale = 1 / math.sqrt(d)
    cuts = [0, 1, 1, 40, 64, n_keys]  # includes an empty piece
    parts = [R._attend(q, k[a:b], v[a:b], scale) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    o = torch.stack([p[0] for p in parts])
    lse = torch.stack([p[1] for p in parts])
    out, out_lse = merge_states(o, lse, backend="triton")
    ref, ref_lse = R._attend(q, k, v, scale)
    assert max_err(out, ref) <= FLOOR[torch.float32]
    assert max_err(out_lse, ref_lse) <= 1e-5


def test_all_dead_and_empty():
    o = torch.full((3, 4, 2, 32), float("nan"), device=DEVICE)
    lse = torch.full((3, 4, 2), float("-inf"), device=DEVICE)
    out, out_lse = merge_states(o, lse, backend="triton")
    assert torch.all(out == 0) and torch.all(out_lse == float("-inf"))
    out, out_lse = merge_states(o[:0], lse[:0], backend="triton")  # N = 0: nothing to merge
    assert out.shape == (4, 2, 32) and torch.all(out == 0) and torch.all(out_lse == float("-inf"))


def test_strided_input():
    gen = torch.Generator().manual_seed(3)
    base = randn(4, 6, 3, 2, 64, gen=gen)
    o = base[:, ::2, :, 0]  # non-contiguous leading dims, contiguous last dim
    lse = randn(4, 3, 3, gen=gen)
    out, out_lse = merge_states(o, lse, backend="triton")
    ref, ref_lse = R.merge_states(o, lse)
    assert max_err(out, ref) <= 1e-5 and max_err(out_lse, ref_lse) <= 1e-5


@pytest.mark.parametrize("dtype", dtype_params())
def test_plus_inf_lse_same_on_both_backends(dtype):
    """+inf LSE (overflowed mass): it outweighs every finite partial; two of them average; never NaN."""
    d = 32
    gen = torch.Generator().manual_seed(5)
    o = randn(4, 5, 2, d, dtype=dtype, gen=gen)
    lse = randn(4, 5, 2, gen=gen)
    inf, ninf = float("inf"), float("-inf")
    lse[1, 0, 0] = inf  # row (0, 0): one +inf partial among finite ones -> its o
    lse[0, 1, 0] = inf  # row (1, 0): two +inf partials -> their mean
    lse[3, 1, 0] = inf
    lse[:, 2, 0] = ninf  # row (2, 0): +inf and -inf (whose o is NaN) only
    lse[2, 2, 0] = inf
    o[:, 2, 0][lse[:, 2, 0] == ninf] = float("nan")
    lse[:, 3, 1] = inf  # row (3, 1): every partial +inf
    got = {b: merge_states(o, lse, backend=b) for b in ("torch", "triton")}
    of = o.float()
    want = {
        (0, 0): of[1, 0, 0],
        (1, 0): (of[0, 1, 0] + of[3, 1, 0]) / 2,
        (2, 0): of[2, 2, 0],
        (3, 1): of[:, 3, 1].mean(0),
    }
    for backend, (out, out_lse) in got.items():
        assert not torch.isnan(out).any() and not torch.isnan(out_lse).any(), backend
        for (r, h), expect in want.items():
            assert out_lse[r, h] == inf, (backend, r, h)
            assert max_err(out[r, h], expect) <= FLOOR[dtype] * 4, (backend, r, h)
    (a, la), (b, lb) = got["torch"], got["triton"]
    assert max_err(a, b) <= FLOOR[dtype] * 4 and max_err(la, lb) <= 1e-5
    finite_rows = torch.isfinite(lse).all(0)  # rows without specials are plain merges
    ref, ref_lse = R.merge_states(o.float(), lse)
    assert max_err(b[finite_rows], ref[finite_rows]) <= FLOOR[dtype] * 4
