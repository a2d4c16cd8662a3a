"""The fused CPU path of split_s_attention (triton_kernels/split_s_cpu.py) vs the naive reference.

Expected values come from :func:`triton_kernels.reference.split_s_attention` (per-row torch.cat of the
keys, materialised scores, fp32) and, for fp16/bf16, the rule of the house: the error of the fused path
against the fp32 reference may be at most twice the error of plain torch attention in that dtype
(:func:`split_s_dense`) plus a floor. These tests run on CPU whatever the machine (the path is CPU-only).
"""

from __future__ import annotations

import math

import pytest
import torch

import triton_kernels.split_s as split_s_mod
from triton_kernels import reference as R
from triton_kernels import split_s_attention, split_s_cpu
from triton_kernels.split_s_cpu import batch_invariant, has_fused_attention, split_s_attention_cpu

from ._helpers import assert_rule, max_err, split_s_dense

NEG_INF = float("-inf")
DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.float16, id="fp16"),
    pytest.param(torch.bfloat16, id="bf16"),
]


def _case(b, m, hkv, g, d, t, slots, lens, dtype, live=True, live_lens=None, p=6, seed=0):
    """Random CPU inputs in ``dtype`` with the given segment table ([B, S] nested lists)."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    q = rnd(b, m, g * hkv, d)
    k_pool, v_pool = rnd(p, t, hkv, d), rnd(p, t, hkv, d)
    k_live = rnd(b, m, hkv, d) if live else None
    v_live = rnd(b, m, hkv, d) if live else None
    seg_slots = torch.tensor(slots, dtype=torch.int32).reshape(b, -1)
    seg_lens = torch.tensor(lens, dtype=torch.int32).reshape(b, -1)
    ll = None if live_lens is None else torch.tensor(live_lens, dtype=torch.int32)
    return (q, k_pool, v_pool, seg_slots, seg_lens, k_live, v_live), ll


def _f32(args):
    return [a.float() if a is not None and a.is_floating_point() else a for a in args]


def _dead_rows(args, live_lens):
    """[B, M] bool: padded query rows and rows without any valid key (expected out 0, lse -inf)."""
    q, _, _, slots, lens, k_live, _ = args
    bsz, m = q.shape[:2]
    n = torch.full((bsz,), m) if live_lens is None else live_lens.long()
    seg_keys = torch.where(slots >= 0, lens.long(), 0).sum(1)
    keys = seg_keys + (n if k_live is not None else 0)
    return (torch.arange(m)[None, :] >= n[:, None]) | (keys == 0)[:, None]


def _check(args, live_lens, scale, dtype):
    """Fused path vs the fp32 reference: rule for low precision, tight in fp32, exact 0 / -inf on dead rows."""
    out, lse = split_s_attention_cpu(*args, scale, live_lens)
    assert out.dtype == dtype and out.shape == args[0].shape
    assert lse.dtype == torch.float32 and lse.shape == args[0].shape[:-1]
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    ref_o, ref_lse = R.split_s_attention(*_f32(args), sm_scale=scale, live_lens=live_lens)
    if dtype == torch.float32:
        assert max_err(out, ref_o) <= 1e-5 and max_err(lse, ref_lse) <= 1e-5
    else:
        dense_scale = 1 / math.sqrt(args[0].shape[-1]) if scale is None else scale
        low_o, low_lse = split_s_dense(*args, dense_scale, dtype, live_lens)
        assert_rule(out, ref_o, low_o, dtype, "out")
        assert_rule(lse, ref_lse, low_lse, dtype, "lse")
    dead = _dead_rows(args, live_lens)
    assert torch.all(out[dead] == 0) and torch.all(lse[dead] == NEG_INF)
    assert torch.isfinite(lse[~dead]).all()
    return out, lse


# Four rows: ragged segment counts (-1 = none), zero-length segments, full slots and tails; row 2 has no
# segment key at all and row 3 one key; live_lens full, short, one, empty.
T = 40
SLOTS = [[0, 2, -1], [3, -1, 5], [-1, -1, 1], [1, 4, 0]]
LENS = [[T, 1, 0], [0, 0, 23], [0, 7, 0], [0, 1, 0]]
LIVE_LENS = [13, 5, 1, 0]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("g", [1, 4, 7])
@pytest.mark.parametrize("d", [64, 128])
def test_matches_reference_ragged(d, g, dtype):
    args, ll = _case(4, 13, 2, g, d, T, SLOTS, LENS, dtype, live_lens=LIVE_LENS, seed=d + g)
    _check(args, ll, 1 / math.sqrt(d), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sm_scale_and_no_live_lens(dtype):
    """A given scale (also the default None = 1/sqrt(D)), all M rows real."""
    args, _ = _case(4, 9, 2, 4, 64, T, SLOTS, LENS, dtype, seed=3)
    _check(args, None, 0.3, dtype)
    out, lse = _check(args, None, None, dtype)
    ref_o, _ = R.split_s_attention(*_f32(args), sm_scale=1 / 8)
    assert max_err(out, ref_o) <= (1e-5 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("seed", range(6))
def test_random_tables(seed):
    """Random B, S, M, GQA group, slot tables with -1 slots, zero-length segments and live_lens in [0, M]."""
    gen = torch.Generator().manual_seed(100 + seed)
    b, s, m = (int(torch.randint(lo, hi, (1,), generator=gen)) for lo, hi in ((1, 6), (0, 5), (1, 20)))
    g = [1, 4, 7][seed % 3]
    p, t = 7, 33
    slots = torch.randint(-1, p, (b, s), generator=gen)
    lens = torch.randint(0, t + 1, (b, s), generator=gen)
    live_lens = torch.randint(0, m + 1, (b,), generator=gen).tolist()
    args, ll = _case(
        b,
        m,
        2,
        g,
        64,
        t,
        slots.tolist(),
        lens.tolist(),
        torch.float32,
        live=seed % 2 == 0,
        live_lens=live_lens,
        p=p,
        seed=seed,
    )
    _check(args, ll, 0.2, torch.float32)


def test_rows_without_keys():
    """Rows with no segment key and no live key (live_lens 0, or no live block) give 0 / -inf exactly,
    beside rows that have keys; a batch without any key and an empty table too."""
    args, ll = _case(
        3, 6, 2, 4, 64, T, [[-1, 2], [0, 1], [3, -1]], [[9, 3], [0, 0], [0, 4]], torch.float32, live_lens=[6, 0, 2]
    )
    out, lse = _check(args, ll, 1 / 8, torch.float32)
    assert torch.all(out[1] == 0) and torch.all(lse[1] == NEG_INF)
    q, kp, vp, slots, lens, kl, vl = args
    # No live block: row 1 has no key at all.
    out, lse = _check((q, kp, vp, slots, lens, None, None), None, 1 / 8, torch.float32)
    assert torch.all(out[1] == 0) and torch.all(lse[1] == NEG_INF) and torch.isfinite(lse[0]).all()
    # No segment columns, no live block: nothing to attend to anywhere.
    empty = torch.zeros(3, 0, dtype=torch.int32)
    out, lse = split_s_attention_cpu(q, kp, vp, empty, empty)
    assert torch.all(out == 0) and torch.all(lse == NEG_INF)
    # No segment columns, live keys only.
    _check((q, kp, vp, empty, empty, kl, vl), ll, 1 / 8, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_poison_outside_the_keys_never_reaches_results(dtype):
    """NaN / huge values in unused pool slots, past each segment's length, and in the padded live rows
    (queries, keys, values): results are bit-equal to clean inputs and still match the reference."""
    args, ll = _case(4, 13, 2, 4, 64, T, SLOTS, LENS, dtype, live_lens=LIVE_LENS, p=7, seed=9)
    clean = _check(args, ll, 1 / 8, dtype)
    q, kp, vp, slots, lens, kl, vl = (a.clone() for a in args)
    big = 6e4 if dtype == torch.float16 else 1e30
    read = {}  # slot -> tokens some row reads of it
    for s, n in zip(slots.flatten().tolist(), lens.flatten().tolist(), strict=True):
        if s >= 0:
            read[s] = max(read.get(s, 0), n)
    assert 6 not in read
    for pool, bad in ((kp, big), (vp, float("nan"))):
        pool[6] = bad  # a slot in no table
        for s, n in read.items():
            pool[s, n:] = bad  # past the longest segment of the slot
    for b, n in enumerate(LIVE_LENS):
        q[b, n:] = float("nan")
        kl[b, n:] = big
        vl[b, n:] = float("nan")
    poisoned = _check((q, kp, vp, slots, lens, kl, vl), ll, 1 / 8, dtype)
    assert torch.equal(poisoned[0], clean[0]) and torch.equal(poisoned[1], clean[1])


def test_a_row_alone_gives_the_same_bits_as_in_a_batch():
    """A request's result does not depend on the other rows of its batch (longer rows, padded live
    blocks; here every row has its own shape, so one fused call each), so batched decoding equals
    single runs."""
    args, ll = _case(4, 13, 2, 4, 64, T, SLOTS, LENS, torch.float32, live_lens=LIVE_LENS, seed=2)
    out, lse = split_s_attention_cpu(*args, None, ll)
    q, kp, vp, slots, lens, kl, vl = args
    for b, n in enumerate(LIVE_LENS):
        o1, l1 = split_s_attention_cpu(
            q[b : b + 1, :n], kp, vp, slots[b : b + 1], lens[b : b + 1], kl[b : b + 1, :n], vl[b : b + 1, :n]
        )
        assert torch.equal(o1, out[b : b + 1, :n]) and torch.equal(l1, lse[b : b + 1, :n])


def test_strided_inputs_and_int64_tables():
    """q/k/v as views of fused buffers (only the last dim contiguous); int64 segment tables."""
    gen = torch.Generator().manual_seed(11)
    b, m, g, hkv, d = 2, 9, 4, 2, 64
    qkv = torch.randn(b, m, g * hkv + 2 * hkv, 2, d, generator=gen)
    q, kl, vl = qkv[:, :, : g * hkv, 0], qkv[:, :, g * hkv : g * hkv + hkv, 1], qkv[:, :, g * hkv + hkv :, 1]
    pool = torch.randn(4, T, 2 * hkv, d, generator=gen)
    args = (
        q,
        pool[:, :, :hkv],
        pool[:, :, hkv:],
        torch.tensor([[2, 0], [1, -1]]),
        torch.tensor([[T, 33], [4, 0]]),
        kl,
        vl,
    )
    assert not q.is_contiguous() and not args[1].is_contiguous()
    _check(args, torch.tensor([9, 3]), 1 / 8, torch.float32)


@pytest.mark.compat
def test_fused_op_present_and_torch_backend_takes_it(monkeypatch):
    """This torch build has the fused op; split_s_attention(backend="torch") on CPU calls the fast path
    (bit-equal to it, counted) and still matches the reference."""
    assert has_fused_attention()
    args, ll = _case(4, 13, 2, 7, 64, T, SLOTS, LENS, torch.float32, live_lens=LIVE_LENS, seed=5)
    out, lse = split_s_attention(*args, live_lens=ll, backend="torch")
    fast_o, fast_lse = split_s_attention_cpu(*args, None, ll)
    assert torch.equal(out, fast_o) and torch.equal(lse, fast_lse)
    ref_o, ref_lse = R.split_s_attention(*args, live_lens=ll)
    assert max_err(out, ref_o) <= 1e-5 and max_err(lse, ref_lse) <= 1e-5
    calls = []

    def spy(*a):
        calls.append(1)
        return split_s_attention_cpu(*a)

    monkeypatch.setattr(split_s_mod, "split_s_attention_cpu", spy)
    split_s_attention(*args, live_lens=ll, backend="torch")
    assert calls == [1]


def test_fused_op_returns_the_natural_log_lse():
    """What the path assumes of torch's fused op: out [B, H, M, D], LSE [B, H, M] fp32 in natural log."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 5, 16, generator=gen) for _ in range(3))
    o, lse = split_s_cpu._FUSED(q, k, v, 0.0, False, scale=0.25)
    s = q @ k.transpose(-1, -2) * 0.25
    assert o.shape == (2, 3, 5, 16) and lse.shape == (2, 3, 5) and lse.dtype == torch.float32
    assert max_err(lse, torch.logsumexp(s, -1)) <= 1e-5
    assert max_err(o, torch.softmax(s, -1) @ v) <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fallback_to_the_reference_without_the_fused_op(monkeypatch, dtype):
    """A torch build without the fused op takes the reference (bit-equal), through the public op too."""
    monkeypatch.setattr(split_s_cpu, "_FUSED", None)
    assert not has_fused_attention()
    args, ll = _case(4, 13, 2, 4, 64, T, SLOTS, LENS, dtype, live_lens=LIVE_LENS, seed=7)
    ref_o, ref_lse = R.split_s_attention(*args, sm_scale=0.2, live_lens=ll)
    for out, lse in (
        split_s_attention_cpu(*args, 0.2, ll),
        split_s_attention(*args, sm_scale=0.2, live_lens=ll, backend="torch"),
    ):
        assert torch.equal(out, ref_o) and torch.equal(lse, ref_lse)


def _count_fused(monkeypatch):
    calls = []
    inner = split_s_cpu._FUSED

    def counted(q, *a, **k):
        calls.append(q.shape[0])  # rows in this call
        return inner(q, *a, **k)

    monkeypatch.setattr(split_s_cpu, "_FUSED", counted)
    return calls


@pytest.mark.parametrize("threads", [1, 2])
def test_rows_of_one_shape_share_one_call_and_keep_their_single_run_bits(monkeypatch, threads):
    """Five rows whose kept segments have the same lengths (different slots, like top-K full chunks of
    different requests): one fused call for all of them, each row bit-equal to the row run alone and
    within fp32 tolerance of the reference; at 1 and 2 torch threads."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        b, m, hkv, g, d, t = 5, 12, 2, 4, 32, 40  # 48 packed query rows, 2 KV heads: batch_invariant
        assert batch_invariant(m * g, hkv)
        slots = [[s, s + 5] for s in range(5)]  # slots 0..9, two per row
        lens = [[T, 17]] * b
        args, _ = _case(b, m, hkv, g, d, t, slots, lens, torch.float32, p=10, seed=21)
        calls = _count_fused(monkeypatch)
        out, lse = _check(args, None, 0.2, torch.float32)
        assert calls == [b]
        q, kp, vp, sl, ln, kl, vl = args
        for r in range(b):
            one = split_s_attention_cpu(
                q[r : r + 1], kp, vp, sl[r : r + 1], ln[r : r + 1], kl[r : r + 1], vl[r : r + 1], 0.2
            )
            assert torch.equal(one[0], out[r : r + 1]) and torch.equal(one[1], lse[r : r + 1])
        assert calls == [b] + [1] * b
    finally:
        torch.set_num_threads(old)


def test_one_call_per_row_shape_in_a_ragged_batch(monkeypatch):
    """Rows 0 and 2 share a shape (40 + 9 segment keys, 12 live rows), rows 1 and 3 another (9 live rows),
    row 4 its own (one segment), row 5 has no key: three calls of 2, 2 and 1 rows; every row matches the
    reference and its single run bit for bit."""
    slots = [[0, 1], [2, 3], [4, 5], [0, 5], [6, -1], [-1, -1]]
    lens = [[T, 9], [T, 9], [T, 9], [T, 9], [30, 0], [0, 0]]
    live_lens = [12, 9, 12, 9, 12, 0]
    args, ll = _case(6, 12, 2, 4, 64, T, slots, lens, torch.float32, live_lens=live_lens, p=7, seed=4)
    calls = _count_fused(monkeypatch)
    out, lse = _check(args, ll, None, torch.float32)
    assert sorted(calls) == [1, 2, 2]
    q, kp, vp, sl, ln, kl, vl = args
    for r, n in enumerate(live_lens):
        one = split_s_attention_cpu(
            q[r : r + 1, :n], kp, vp, sl[r : r + 1], ln[r : r + 1], kl[r : r + 1, :n], vl[r : r + 1, :n]
        )
        assert torch.equal(one[0], out[r : r + 1, :n]) and torch.equal(one[1], lse[r : r + 1, :n])


def test_batch_invariant_rule():
    """Hand-worked cases of the rule: at least 32 packed query rows and at least two work items
    (KV heads x query blocks of 32 / 64 / 256 rows) for a row alone."""
    assert not batch_invariant(31, 4)  # small query block: per-thread scratch misaligned
    assert not batch_invariant(1, 8)
    assert not batch_invariant(32, 1)  # one item: runs outside the parallel region
    assert batch_invariant(32, 2)  # two heads
    assert batch_invariant(33, 1)  # two query blocks of 32
    assert batch_invariant(64, 1)  # two query blocks of 32
    assert batch_invariant(191, 1)  # 6 blocks of 32
    assert batch_invariant(192, 1)  # 3 blocks of 64


def test_rows_outside_the_rule_run_one_call_each(monkeypatch):
    """Three rows of one shape but only 3 x 4 = 12 packed query rows (below the rule): one call per row."""
    args, _ = _case(3, 3, 2, 4, 64, T, [[0], [1], [2]], [[T], [T], [T]], torch.float32, p=4, seed=8)
    calls = _count_fused(monkeypatch)
    _check(args, None, 0.125, torch.float32)
    assert calls == [1, 1, 1]


def test_a_non_finite_row_leaves_its_group_on_the_fused_path(monkeypatch):
    """One row of a three-row group has a NaN query: that row follows the reference's rule (its query
    row is NaN), the other two still share one fused call and equal their clean results bit for bit."""
    args, _ = _case(3, 12, 2, 4, 64, T, [[0], [1], [2]], [[T], [T], [T]], torch.float32, p=4, seed=13)
    clean_o, clean_lse = split_s_attention_cpu(*args, 0.125)
    q = args[0].clone()
    q[1, 5, 3, 0] = float("nan")
    calls = _count_fused(monkeypatch)
    out, lse = split_s_attention_cpu(q, *args[1:], 0.125)
    assert calls == [2]
    ref_o, ref_lse = R.split_s_attention(q, *args[1:], sm_scale=0.125)
    assert torch.isnan(lse[1, 5, 3]) and torch.isnan(ref_lse[1, 5, 3])
    assert torch.equal(torch.isnan(lse), torch.isnan(ref_lse))
    for r in (0, 2):
        assert torch.equal(out[r], clean_o[r]) and torch.equal(lse[r], clean_lse[r])
