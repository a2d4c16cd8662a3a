"""chunk_attention_scores / chunk_row_mass vs the references, dense probabilities and mass invariants."""

from __future__ import annotations

import math

import pytest
import torch

from triton_kernels import chunk_attention_scores, chunk_row_mass
from triton_kernels import reference as R
from triton_kernels.chunk_scores import chunk_attention_scores_launch
from triton_kernels.plan import H200, assume_gpu, plan_chunk_scores

from ._helpers import DEVICE, assert_rule, dtype_params, max_err, randn

HKV = 2
T = 70


def _dense_probs(q, k, lens, k_extra, scale, dtype):
    """Per chunk: full softmax matrix over (valid chunk keys + extra keys), scores in ``dtype``.

    -> (mass [N, Hkv, T], extra [N, Hkv, E], lse [N, M, Hq], row_to_extra [N, Hkv, M]) fp32.
    """
    n, m, hq, _ = q.shape
    t, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    e = 0 if k_extra is None else k_extra.shape[1]
    mass = torch.zeros(n, hkv, t, device=q.device)
    extra = torch.zeros(n, hkv, e, device=q.device)
    lse = torch.full((n, m, hq), float("-inf"), device=q.device)
    to_extra = torch.zeros(n, hkv, m, device=q.device)
    for i in range(n):
        ln = t if lens is None else int(lens[i])
        keys = torch.cat([k[i, :ln]] + ([] if k_extra is None else [k_extra[i]]))
        if keys.shape[0] == 0:
            continue
        kk = keys.to(dtype).repeat_interleave(g, dim=1)
        s = (torch.einsum("mhd,lhd->hml", q[i].to(dtype), kk) * scale).float()  # [Hq, M, L]
        p = torch.softmax(s, dim=-1)
        per_kv = p.sum(1).view(hkv, g, -1).sum(1)
        mass[i, :, :ln] = per_kv[:, :ln]
        extra[i] = per_kv[:, ln:]
        lse[i] = torch.logsumexp(s, -1).transpose(0, 1)
        to_extra[i] = p[..., ln:].sum(-1).view(hkv, g, m).sum(1)
    return mass, extra, lse, to_extra


def _inputs(n, m, g, d, e, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q = randn(n, m, g * HKV, d, dtype=dtype, gen=gen)
    k = randn(n, T, HKV, d, dtype=dtype, gen=gen)
    k_extra = randn(n, e, HKV, d, dtype=dtype, gen=gen) if e is not None else None
    return q, k, k_extra


LENS = [T, 0, 1, 45]


@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize(
    "m,g,d,e,use_lens",
    [
        (1, 1, 64, 5, True),
        (17, 7, 64, 9, True),
        (33, 4, 128, None, True),
        (17, 1, 128, 0, False),
        (5, 7, 64, 17, False),
    ],
    ids=lambda x: str(x),
)
def test_scores_match_references(m, g, d, e, use_lens, dtype):
    q, k, k_extra = _inputs(4, m, g, d, e, dtype, seed=m + g + d)
    lens = torch.tensor(LENS, dtype=torch.int32, device=DEVICE) if use_lens else None
    scale = 1 / math.sqrt(d)
    mass, extra, lse = chunk_attention_scores(q, k, lens, k_extra, backend="triton")
    e_eff = 0 if k_extra is None else k_extra.shape[1]
    assert mass.shape == (4, HKV, T) and extra.shape == (4, HKV, e_eff) and lse.shape == (4, m, g * HKV)
    assert not any(torch.isnan(x).any() for x in (mass, extra, lse))
    f32 = [None if x is None else x.float() for x in (q, k, k_extra)]
    ref = R.chunk_attention_scores(f32[0], f32[1], lens, f32[2], sm_scale=scale)
    dense = _dense_probs(f32[0], f32[1], lens, f32[2], scale, torch.float32)
    low = _dense_probs(q, k, lens, k_extra, scale, dtype)
    for name, got, r, dn, lo in zip(("mass", "extra", "lse"), (mass, extra, lse), ref, dense, low, strict=False):
        assert max_err(r, dn) <= 1e-4, name  # the two references agree
        assert_rule(got, r, lo, dtype, name)
    if use_lens:
        assert torch.all(mass[1] == 0) and torch.all(mass[2, :, 1:] == 0) and torch.all(mass[3, :, 45:] == 0)


@pytest.mark.parametrize("g", [1, 7])
def test_mass_sums_to_queries_times_heads(g):
    """Scoring tokens' own keys as the extra keys: every (chunk, KV head) hands out M*G units."""
    m, d = 17, 64
    gen = torch.Generator().manual_seed(g)
    q = randn(4, m, g * HKV, d, gen=gen)
    k = randn(4, T, HKV, d, gen=gen)
    k_own = randn(4, m, HKV, d, gen=gen)
    lens = torch.tensor(LENS, device=DEVICE)
    mass, extra, _ = chunk_attention_scores(q, k, lens, k_own, backend="triton")
    total = mass.sum(-1) + extra.sum(-1)  # [N, Hkv]
    assert torch.allclose(total, torch.full_like(total, m * g), rtol=1e-5, atol=1e-4)


def test_no_keys_at_all():
    q, k, _ = _inputs(2, 5, 4, 64, None, torch.float32, seed=3)
    lens = torch.tensor([0, 3], device=DEVICE)
    mass, extra, lse = chunk_attention_scores(q, k, lens, None, backend="triton")
    assert torch.all(mass[0] == 0) and torch.all(lse[0] == float("-inf")) and extra.shape == (2, HKV, 0)
    assert torch.isfinite(lse[1]).all()


def test_small_tiles_agree():
    q, k, k_extra = _inputs(3, 17, 7, 64, 9, torch.float16, seed=9)
    lens = torch.tensor([T, 0, 33], device=DEVICE)
    a = chunk_attention_scores_launch(q, k, lens, k_extra, 0.2, block_m=16, block_n=16)
    b = chunk_attention_scores_launch(q, k, lens, k_extra, 0.2)
    for x, y in zip(a, b, strict=True):
        assert max_err(x, y) <= 1e-4


@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("lens,e", [(None, 7), ([100], 7), ([0], 7), ([600], 0), ([333], 64)], ids=str)
def test_row_lse_split_over_keys(lens, e, dtype):
    """Few chunks on a 132-SM plan: pass 1 splits the keys (here 2 splits of 320); the combined LSEs,
    the masses and the output LSE equal the reference, including a split past lens and an empty chunk."""
    n, m, g, hkv, d, t = 1, 5, 2, 1, 16, 600
    gen = torch.Generator().manual_seed(len(str(lens)) + e)
    q = randn(n, m, g * hkv, d, dtype=dtype, gen=gen)
    assert plan_chunk_scores(n, m, g * hkv, hkv, d, t, q.element_size(), H200).n_splits == 2
    k = randn(n, t, hkv, d, dtype=dtype, gen=gen)
    x = randn(n, e, hkv, d, dtype=dtype, gen=gen) if e else None
    ln = None if lens is None else torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    with assume_gpu(H200):
        mass, extra, lse = chunk_attention_scores(q, k, ln, x, backend="triton")
    f32 = [None if a is None else a.float() for a in (q, k, x)]
    ref = R.chunk_attention_scores(f32[0], f32[1], ln, f32[2], sm_scale=0.25)
    low = _dense_probs(q, k, ln, x, 0.25, dtype)
    for name, got, r, lo in zip(("mass", "extra", "lse"), (mass, extra, lse), ref, low, strict=False):
        assert not torch.isnan(got).any(), name
        assert_rule(got, r, lo, dtype, name)


@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("g,d,e,use_lens", [(1, 64, 5, True), (7, 64, 9, True), (4, 128, 33, False)], ids=str)
def test_row_mass_matches_references(g, d, e, use_lens, dtype):
    gen = torch.Generator().manual_seed(g * d + e)
    q = randn(4, T, g * HKV, d, dtype=dtype, gen=gen)  # the chunk tokens' own queries
    k = randn(4, T, HKV, d, dtype=dtype, gen=gen)
    k_extra = randn(4, e, HKV, d, dtype=dtype, gen=gen)
    lens = torch.tensor(LENS, dtype=torch.int32, device=DEVICE) if use_lens else None
    scale = 1 / math.sqrt(d)
    out = chunk_row_mass(q, k, lens, k_extra, backend="triton")
    assert out.shape == (4, HKV, T) and not torch.isnan(out).any()
    ref = R.chunk_row_mass(q.float(), k.float(), lens, k_extra.float(), sm_scale=scale)
    # Dense: chunk rows attend over (valid chunk keys + extra keys); mass on the extra keys.
    dense = torch.zeros_like(ref)
    low = torch.zeros_like(ref)
    for i in range(4):
        ln = T if lens is None else int(lens[i])
        qi, ki, xi = q[i : i + 1, :ln], k[i : i + 1], k_extra[i : i + 1]
        li = torch.tensor([ln], device=DEVICE)
        dense[i, :, :ln] = _dense_probs(qi.float(), ki.float(), li, xi.float(), scale, torch.float32)[3][0]
        low[i, :, :ln] = _dense_probs(qi, ki, li, xi, scale, dtype)[3][0]
    assert max_err(ref, dense) <= 1e-5
    assert_rule(out, ref, low, dtype, "row mass")
    assert torch.all(out <= g + 1e-4) and torch.all(out >= 0)
    if use_lens:
        assert torch.all(out[1] == 0) and torch.all(out[3, :, 45:] == 0)


def test_row_mass_without_extra_keys_is_zero():
    q, k, _ = _inputs(2, T, 4, 64, None, torch.float32, seed=1)
    assert torch.all(chunk_row_mass(q, k, None, None, backend="triton") == 0)
    assert torch.all(chunk_row_mass(q, k, None, k[:, :0], backend="triton") == 0)
    assert torch.all(R.chunk_row_mass(q, k, None, None) == 0)


# ============================================================================ mass direction, by value
# Closed-form cases whose masses differ by direction: the mass a chunk key *receives*
# (a column sum of the softmax matrix) is not the mass a row *sends* (every softmax row sums to 1),
# so a row/column mix-up changes the values, not only the shape. The sizes make such mix-ups
# shape-compatible: M * G = 96 query rows, so the kernels' query tile (BLOCK_M = 64) is as wide as their
# key tile (BLOCK_N = 64); M = T + E for the received mass (a query row is as long as a key column) and
# T = E for the sent mass (a chunk row's extra part is as long as a column of extra keys).
# Expected values are the softmax written out by hand for logits that take two or three known values.
# Self-contained section: its own imports and helpers.
import math  # noqa: E402, F811

import pytest  # noqa: E402, F811
import torch  # noqa: E402, F811

import triton_kernels  # noqa: E402

DIR_N, DIR_HKV, DIR_G, DIR_D = 2, 2, 2, 16
DIR_DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
HUB_ROW_LOGIT = 3.0  # sm_scale = 1: q.k is the logit


def _dir_logit(h: int) -> float:
    """Logit a_h (b_h) of query head h on its target keys: unequal heads, so that a wrong GQA grouping shows."""
    return 1.0 + 0.5 * h


def _dir_axis(i: int) -> torch.Tensor:
    e = torch.zeros(DIR_D)
    e[i] = 1.0
    return e


def _dir_hub(n: int, kv: int) -> int:
    """The one chunk key of (chunk n, KV head kv) that every pointing query looks at."""
    return 3 + 5 * n + 11 * kv


def _dir_keys(t: int, e: int):
    """Chunk keys ``[N, t, Hkv, D]``: e0 at the hub of each (chunk, KV head), e1 elsewhere; extra keys
    ``[N, e, Hkv, D]``: e2."""
    k = _dir_axis(1).repeat(DIR_N, t, DIR_HKV, 1)
    for n in range(DIR_N):
        for kv in range(DIR_HKV):
            k[n, _dir_hub(n, kv), kv] = _dir_axis(0)
    return k, _dir_axis(2).repeat(DIR_N, e, DIR_HKV, 1)


def _dir_lens(use_lens: bool, t: int):
    return torch.tensor([t, 25], dtype=torch.int32) if use_lens else None


def _dir_dev(x):
    return None if x is None else x.to(DIR_DEVICE)


def _dir_err(got: torch.Tensor, want: torch.Tensor) -> float:
    assert got.shape == want.shape, (tuple(got.shape), tuple(want.shape))
    return (got.double().cpu() - want).abs().max().item()


@pytest.mark.parametrize("use_lens", [False, True], ids=["full", "ragged"])
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_received_mass_is_a_column_sum_by_value(backend, use_lens):
    """Queries m < M/2 of query head h put logit a_h on their KV head's hub key and 0 on every other
    key; the rest (q = 0) attend uniformly. Over L = lens + E keys, with Z_h = e^(a_h) + L - 1, every
    key receives M/2 / L per head from the uniform rows and M/2 / Z_h (the hub: M/2 e^(a_h) / Z_h) from
    the pointing ones, summed over the G heads h = kv G .. kv G + G - 1 of its KV head."""
    t, e, m = 32, 16, 48
    k, k_extra = _dir_keys(t, e)
    q = torch.zeros(DIR_N, m, DIR_HKV * DIR_G, DIR_D)
    for h in range(DIR_HKV * DIR_G):
        q[:, : m // 2, h] = _dir_logit(h) * _dir_axis(0)
    lens = _dir_lens(use_lens, t)
    mass, extra, lse = triton_kernels.chunk_attention_scores(
        _dir_dev(q), _dir_dev(k), _dir_dev(lens), _dir_dev(k_extra), sm_scale=1.0, backend=backend
    )
    half = m // 2
    want = torch.zeros(DIR_N, DIR_HKV, t, dtype=torch.float64)
    want_extra = torch.zeros(DIR_N, DIR_HKV, e, dtype=torch.float64)
    want_lse = torch.zeros(DIR_N, m, DIR_HKV * DIR_G, dtype=torch.float64)
    for n in range(DIR_N):
        ln = t if lens is None else int(lens[n])
        n_keys = ln + e
        for h in range(DIR_HKV * DIR_G):
            kv, ea = h // DIR_G, math.exp(_dir_logit(h))
            z = ea + n_keys - 1
            want[n, kv, :ln] += half / n_keys + half / z
            want[n, kv, _dir_hub(n, kv)] += half * (ea - 1) / z  # the hub's share above the others'
            want_extra[n, kv] += half / n_keys + half / z
            want_lse[n, :half, h] = math.log(z)
            want_lse[n, half:, h] = math.log(n_keys)
    err = _dir_err(mass, want)
    assert err < 1e-4, f"received mass off by {err:.3e}"
    assert _dir_err(extra, want_extra) < 1e-4
    assert _dir_err(lse, want_lse) < 1e-5
    # the directions differ: the hub receives over twice what other keys do, while every row sends 1 per head
    assert want[0, 0, _dir_hub(0, 0)] > 2 * want[0, 0, 0]


@pytest.mark.parametrize("use_lens", [False, True], ids=["full", "ragged"])
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_sent_mass_is_a_row_sum_by_value(backend, use_lens):
    """Chunk rows t % 3 == 0 of query head h put logit b_h on each of the E extra keys (0 on the chunk
    keys): they send E e^(b_h) / (E e^(b_h) + lens) to the extra keys; the other rows put logit c on their
    hub key and send E / (e^c + lens - 1 + E). Summed over the G heads of each KV head; 0 beyond lens."""
    t = e = 48
    k, k_extra = _dir_keys(t, e)
    q = (HUB_ROW_LOGIT * _dir_axis(0)).repeat(DIR_N, t, DIR_HKV * DIR_G, 1)
    for h in range(DIR_HKV * DIR_G):
        q[:, ::3, h] = _dir_logit(h) * _dir_axis(2)
    lens = _dir_lens(use_lens, t)
    args = (_dir_dev(q), _dir_dev(k), _dir_dev(lens), _dir_dev(k_extra))
    out = triton_kernels.chunk_row_mass(*args, sm_scale=1.0, backend=backend)
    ec = math.exp(HUB_ROW_LOGIT)
    want = torch.zeros(DIR_N, DIR_HKV, t, dtype=torch.float64)
    for n in range(DIR_N):
        ln = t if lens is None else int(lens[n])
        for h in range(DIR_HKV * DIR_G):
            kv, eb = h // DIR_G, math.exp(_dir_logit(h))
            assert _dir_hub(n, kv) < ln  # every row's hub is a valid key
            for row in range(ln):
                want[n, kv, row] += e * eb / (e * eb + ln) if row % 3 == 0 else e / (ec + ln - 1 + e)
    err = _dir_err(out, want)
    assert err < 1e-5, f"sent mass off by {err:.3e}"
    # the directions differ: rows send unequal amounts, while by symmetry every extra key receives the same
    assert want[0, 0, 0] > 1.5 * want[0, 0, 1]
