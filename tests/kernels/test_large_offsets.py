"""64-bit offsets: views whose element offsets pass 2**31 give the reference result in every kernel.

The views live in one lazily allocated buffer of 2**31 + 2**26 elements (torch.empty maps
it without touching it; only the pages the views cover cost memory, checked below): batch
strides of 2**31, token strides of 2**27 (token 16 starts past 2**31), slot strides of 2**30.
"""

from __future__ import annotations

import pytest
import torch

from triton_kernels import (
    chunk_attention_scores,
    chunk_row_mass,
    merge_states,
    split_s_attention,
    topb_gather,
)
from triton_kernels import reference as R

from ._helpers import DEVICE, ON_GPU, assert_rule, max_err, split_s_dense

pytestmark = pytest.mark.skipif(ON_GPU, reason="CPU lazy allocation; a GPU would need the 4-8 GB for real")

N_ELEMENTS = 2**31 + 2**26
BIG = 2**31
ROW = 2**30 + 2**20  # batch stride that fits int32: row 2 starts past 2**31 (an int32 product would wrap)
TOK = 2**27  # token stride: token 16 of a view starts at 2**31
HKV, G, D, T = 2, 2, 32, 17  # token T - 1 = 16 of a TOK-strided view lies past 2**31


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


class Lazy:
    """Views into one untouched buffer; each view gets seeded random data (touching only its pages).

    Views start a page apart. Were two of them to share an element, kernel and reference would still
    read the same (last written) value: every view is written before any op reads.
    """

    def __init__(self, dtype: torch.dtype):
        self.buf = torch.empty(N_ELEMENTS, dtype=dtype)
        self.gen = torch.Generator().manual_seed(0)
        self.next = 0  # storage offset of the next view

    def view(self, shape, strides):
        extent = 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
        assert self.next + extent <= N_ELEMENTS
        v = self.buf.as_strided(shape, strides, self.next)
        v.copy_(torch.randn(shape, generator=self.gen).to(self.buf.dtype))
        self.next += 4096
        return v

    def offsets_past_2_31(self, v) -> bool:
        return v.storage_offset() + sum((n - 1) * s for n, s in zip(v.shape, v.stride(), strict=True)) >= BIG


@pytest.fixture
def lazy(request):
    rss0 = _rss_mb()
    lz = Lazy(request.param)
    yield lz
    assert _rss_mb() - rss0 < 256, "the lazy buffer was touched beyond its views"
    del lz


def _i32(x):
    return torch.tensor(x, dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("lazy", [torch.float32, torch.float16], indirect=True, ids=["fp32", "fp16"])
def test_split_s_attention(lazy):
    dtype = lazy.buf.dtype
    m = 5
    q = lazy.view((3, m, G * HKV, D), (ROW, G * HKV * D, D, 1))  # q[2] past 2**31: b * stride_qb
    k_pool = lazy.view((3, T, HKV, D), (2**12, TOK, D, 1))  # token 16 past 2**31: token * stride_kt
    v_pool = lazy.view((3, T, HKV, D), (2**30, HKV * D, D, 1))  # slot 2 at 2**31
    k_live = lazy.view((3, m, HKV, D), (ROW, HKV * D, D, 1))
    v_live = lazy.view((3, m, HKV, D), (ROW, HKV * D, D, 1))
    assert all(lazy.offsets_past_2_31(x) for x in (q, k_pool, v_pool, k_live, v_live))
    slots, lens = _i32([[2, 0], [1, -1], [0, 2]]), _i32([[T, 9], [T - 2, 0], [T, T]])
    live_lens = _i32([m, 3, 4])
    args = (q, k_pool, v_pool, slots, lens, k_live, v_live)
    out, lse = split_s_attention(*args, live_lens=live_lens, backend="triton")
    f32 = [a.float() if a.is_floating_point() else a for a in args]
    ref, ref_lse = R.split_s_attention(*f32, live_lens=live_lens)
    low, low_lse = split_s_dense(*args, D**-0.5, dtype, live_lens)
    assert_rule(out, ref, low, dtype, "out")
    assert_rule(lse, ref_lse, low_lse, dtype, "lse")


@pytest.mark.parametrize("lazy", [torch.float32], indirect=True, ids=["fp32"])
def test_chunk_scores_and_row_mass(lazy):
    n, m, e = 3, 3, 4
    q = lazy.view((n, m, G * HKV, D), (ROW, G * HKV * D, D, 1))
    k = lazy.view((n, T, HKV, D), (HKV * D * T, TOK, D, 1))  # offs_n * stride_kt past 2**31
    x = lazy.view((n, e, HKV, D), (ROW, HKV * D, D, 1))
    lens = _i32([T, T - 1, 0])
    mass, extra, lse = chunk_attention_scores(q, k, lens, x, backend="triton")
    for got, want in zip((mass, extra, lse), R.chunk_attention_scores(q, k, lens, x), strict=True):
        assert max_err(got, want) <= 1e-4
    qc = lazy.view((n, T, G * HKV, D), (G * HKV * D * T, TOK, D, 1))  # chunk tokens' queries
    got = chunk_row_mass(qc, k, lens, x, backend="triton")
    assert max_err(got, R.chunk_row_mass(qc, k, lens, x)) <= 1e-4


@pytest.mark.parametrize("lazy", [torch.float32], indirect=True, ids=["fp32"])
def test_topb_gather_and_merge_states(lazy):
    n = 3
    k = lazy.view((n, T, HKV, D), (ROW, HKV * D, D, 1))  # k[2] past 2**31
    v = lazy.view((n, T, HKV, D), (HKV * D * T, TOK, D, 1))
    scores = torch.randn(n, HKV, T, generator=torch.Generator().manual_seed(1))
    got = topb_gather(scores, k, v, 6, lens=_i32([T, T - 2, 3]), backend="triton")
    for a, b in zip(got, R.topb_gather(scores, k, v, 6, lens=_i32([T, T - 2, 3])), strict=True):
        assert torch.equal(a, b)
    o = lazy.view((3, 4, HKV, D), (2**30, HKV * D, D, 1))  # partial 2 at 2**31
    lse = torch.randn(3, 4, HKV, generator=torch.Generator().manual_seed(2))
    out, out_lse = merge_states(o, lse, backend="triton")
    ref, ref_lse = R.merge_states(o, lse)
    assert max_err(out, ref) <= 2e-5 and max_err(out_lse, ref_lse) <= 1e-5
