"""topb_gather's selection kernel (``_select_topb_kernel`` + the gather's bad-chunk rule) against the naive
reference: row lengths up to 1024, B below / at / above the valid length, ragged lens, heavy ties, signed
zeros, infinities, NaN beyond lens; bad chunks (NaN among the valid scores, a length outside [0, T],
int64 lengths past 2**32) keep nothing (idx -1, kept 0), are NaN and set the error word; the torch
selection that serves rows longer than the kernel's registers obeys the same rule."""

from __future__ import annotations

import pytest
import torch

import triton_kernels as tk
from triton_kernels import _dispatch, topb
from triton_kernels import reference as R

from ._helpers import DEVICE

HKV, D = 2, 4  # tiny K/V rows: the selection is what is tested here


@pytest.fixture(autouse=True)
def _clean_error_word():
    for w in _dispatch._ERROR_WORDS.values():
        w.zero_()
    yield
    for w in _dispatch._ERROR_WORDS.values():
        w.zero_()


def _kv(n, t, seed):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(n, t, HKV, D, generator=g).to(DEVICE)
    v = torch.randn(n, t, HKV, D, generator=g).to(DEVICE)
    return k, v


def _scores(kind, n, t, seed):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(n, HKV, t, generator=g)
    if kind == "ties":  # few distinct values: long runs of equal pooled scores
        s = torch.randint(-2, 3, (n, HKV, t), generator=g).float()
    elif kind == "zeros":  # -0.0 and +0.0 compare equal: a tie, the earlier token wins
        signed = torch.where(torch.rand(n, HKV, t, generator=g) < 0.5, -0.0, 0.0)
        s = signed - (torch.rand(n, HKV, t, generator=g) < 0.2).float()  # -0.0 - 0.0 stays -0.0
    elif kind == "inf":
        s[..., ::5] = float("inf")
        s[..., 1::7] = float("-inf")
    return s.to(DEVICE)


def _check(got, want):
    for name, x, y in zip(("k_out", "v_out", "idx", "kept"), got, want, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert torch.equal(x, y), (name, x, y)


@pytest.mark.parametrize(
    "t,b,kind,pool,keep_first,ragged",
    [
        (1, 1, "randn", 7, True, False),
        (33, 5, "ties", 1, False, True),
        (64, 64, "randn", 3, True, False),  # b = T: everything valid is kept
        (100, 130, "inf", 7, True, True),  # b > T
        (200, 17, "zeros", 1, False, True),
        (200, 40, "ties", 7, True, False),
        (1024, 256, "randn", 7, True, True),  # the paper's chunk size and budget
        (1024, 300, "ties", 5, False, False),
    ],
)
def test_matches_reference(t, b, kind, pool, keep_first, ragged):
    n = 3
    scores = _scores(kind, n, t, seed=t + b)
    k, v = _kv(n, t, seed=b)
    lens = torch.tensor([t, max(0, t // 3 - 1), 0], dtype=torch.int64, device=DEVICE) if ragged else None
    got = tk.topb_gather(scores, k, v, b, lens=lens, pool_kernel=pool, keep_first=keep_first, backend="triton")
    _check(got, R.topb_gather(scores, k, v, b, lens=lens, pool_kernel=pool, keep_first=keep_first))


def test_nan_beyond_lens_is_ignored_and_strided_scores():
    t, b = 50, 9
    base = _scores("randn", 2, 2 * t, seed=3)[..., ::2]  # token stride 2
    base[1, :, 30:] = float("nan")
    k, v = _kv(2, t, seed=4)
    lens = torch.tensor([t, 30], dtype=torch.int32, device=DEVICE)
    got = tk.topb_gather(base, k, v, b, lens=lens, backend="triton")
    _check(got, R.topb_gather(base, k, v, b, lens=lens))
    tk.check_errors()  # nothing reported


@pytest.mark.parametrize("long_rows", [False, True], ids=["kernel", "torch-selection"])
def test_bad_chunk_keeps_nothing_is_nan_and_reported(monkeypatch, long_rows):
    """Host checks off (the CUDA default): a NaN among one head's valid scores, or a length outside [0, T]
    (2**32 + 5 would read as 5 if narrowed to int32), makes the whole chunk idx -1, kept 0, K/V NaN and
    sets ERR_TOPB; the other chunks equal the reference. The old code returned the sort's indices and
    kept = min(b, lens) for such a chunk."""
    if long_rows:  # rows past the kernel's limit: torch selection + the plain gather + torch flags
        monkeypatch.setattr(topb, "MAX_SELECT_T", 16)
    t, b = 40, 6
    scores = _scores("randn", 5, t, seed=7)
    k, v = _kv(5, t, seed=8)
    scores[1, 1, 12] = float("nan")  # head 1 only: head 0 of chunk 1 is bad too
    lens = torch.tensor([t, 30, -1, 2**32 + 5, 25], dtype=torch.int64, device=DEVICE)
    with tk.skip_value_checks():
        k_out, v_out, idx, kept = tk.topb_gather(scores, k, v, b, lens=lens, backend="triton")
    bad = [1, 2, 3]
    assert kept.tolist() == [b, 0, 0, 0, b]
    assert (idx[bad] == -1).all() and torch.isnan(k_out[bad]).all() and torch.isnan(v_out[bad]).all()
    good = [0, 4]
    want = R.topb_gather(scores[good], k[good], v[good], b, lens=lens[good])
    _check((k_out[good], v_out[good], idx[good], kept[good]), want)
    with pytest.raises(ValueError, match="topb_gather: a lens entry outside"):
        tk.check_errors()


def test_checked_mode_still_raises():
    scores = _scores("randn", 2, 12, seed=1)
    scores[0, 0, 3] = float("nan")
    k, v = _kv(2, 12, seed=2)
    with tk.eager_value_checks(), pytest.raises(ValueError, match="NaN"):  # the checked mode, on any device
        tk.topb_gather(scores, k, v, 4, backend="triton")


def test_rows_past_the_kernel_limit_use_the_torch_selection(monkeypatch):
    monkeypatch.setattr(topb, "MAX_SELECT_T", 16)
    scores, (k, v) = _scores("ties", 2, 40, seed=5), _kv(2, 40, seed=6)
    lens = torch.tensor([40, 7], dtype=torch.int32, device=DEVICE)
    _check(tk.topb_gather(scores, k, v, 9, lens=lens, backend="triton"), R.topb_gather(scores, k, v, 9, lens=lens))
