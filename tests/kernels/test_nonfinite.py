"""NaN/inf inputs: one rule on every backend (Triton, the CPU fused path, the references).

The rule (:mod:`triton_kernels.reference`): a non-finite logit makes its query row NaN (out and
lse); NaN in a valid value makes only those out components NaN; a row is reported empty
(out 0, lse -inf) only when it has no valid key; a NaN partial LSE makes a merged row NaN; a
non-finite ``sm_scale`` is a ValueError. Each case checks the NaN pattern against one derived
from the inputs alone, and every other element against the reference run on clean inputs.
"""

from __future__ import annotations

import pytest
import torch

from triton_kernels import chunk_attention_scores, chunk_row_mass, merge_states, split_s_attention
from triton_kernels import reference as R
from triton_kernels.chunk_scores import chunk_attention_scores_launch
from triton_kernels.plan import H200, assume_gpu, plan_chunk_scores
from triton_kernels.split_s import split_s_launch

from ._helpers import DEVICE, randn

NAN, INF = float("nan"), float("inf")
B, M, G, HKV, D, P, T = 2, 3, 2, 2, 16, 4, 40
HQ = G * HKV
SCALE = 0.25
# Slot 0 is shared: row 0 sees its first 40 tokens, row 1 only its first 7.
SLOTS = [[0, 2], [1, 0]]
LENS = [[40, 13], [25, 7]]


def _split_case(seed=0):
    gen = torch.Generator().manual_seed(seed)
    t = dict(
        q=randn(B, M, HQ, D, gen=gen),
        k_pool=randn(P, T, HKV, D, gen=gen),
        v_pool=randn(P, T, HKV, D, gen=gen),
        k_live=randn(B, M, HKV, D, gen=gen),
        v_live=randn(B, M, HKV, D, gen=gen),
    )
    slots = torch.tensor(SLOTS, dtype=torch.int32, device=DEVICE)
    lens = torch.tensor(LENS, dtype=torch.int32, device=DEVICE)
    return t, slots, lens


def _args(t, slots, lens):
    return (t["q"], t["k_pool"], t["v_pool"], slots, lens, t["k_live"], t["v_live"])


def _split_backends():
    """name -> f(args) -> (out, lse): the public op on both backends, Triton plans forced, the reference."""
    return {
        "triton": lambda a: split_s_attention(*a, sm_scale=SCALE, backend="triton"),
        "triton-split16": lambda a: split_s_launch(*a, SCALE, block_m=16, block_n=16, split_len=16),
        "triton-2segs": lambda a: split_s_launch(*a, SCALE, segs_per_prog=2),
        "torch": lambda a: split_s_attention(*a, sm_scale=SCALE, backend="torch"),
        "reference": lambda a: R.split_s_attention(*a, sm_scale=SCALE),
    }


# (tensor, index, value). Pool token 10 of slot 0 is valid for row 0 only; token 30 of slot 1 is past
# row 1's length (25) and must change nothing.
SPLIT_CASES = {
    "nan-key": ("k_pool", (0, 10, 1, 3), NAN),
    "inf-key": ("k_pool", (0, 10, 0, 3), INF),
    "neg-inf-key": ("k_pool", (2, 5, 1, 0), -INF),  # rows with q[..., 0] > 0 get one -inf logit
    "nan-live-key": ("k_live", (1, 2, 0, 7), NAN),
    "nan-q": ("q", (0, 1, 2, 5), NAN),
    "inf-q": ("q", (1, 0, 3, 5), INF),
    "neg-inf-q": ("q", (1, 2, 0, 9), -INF),
    "nan-value": ("v_pool", (1, 4, 1, 6), NAN),
    "nan-past-length": ("k_pool", (1, 30, 0, 0), NAN),
}


def _expected_split_nan(name, idx):
    """NaN masks (out [B, M, Hq, D], lse [B, M, Hq]) the rule gives for one non-finite input."""
    out = torch.zeros(B, M, HQ, D, dtype=torch.bool)
    lse = torch.zeros(B, M, HQ, dtype=torch.bool)
    heads = lambda h: slice(h * G, (h + 1) * G)  # noqa: E731  query heads of KV head h
    if name == "q":
        b, m, hq, _ = idx
        lse[b, m, hq] = True
    elif name in ("k_pool", "v_pool"):
        slot, tok, h, d = idx
        for b in range(B):
            if any(s == slot and tok < n for s, n in zip(SLOTS[b], LENS[b], strict=True)):
                if name == "k_pool":
                    lse[b, :, heads(h)] = True
                else:
                    out[b, :, heads(h), d] = True
    elif name == "k_live":
        b, _, h, _ = idx
        lse[b, :, heads(h)] = True
    return out | lse[..., None], lse


@pytest.mark.parametrize("case", list(SPLIT_CASES))
def test_split_s_nonfinite_inputs_agree(case):
    name, idx, value = SPLIT_CASES[case]
    t, slots, lens = _split_case()
    clean_o, clean_lse = R.split_s_attention(*_args(t, slots, lens), sm_scale=SCALE)
    t[name][idx] = value
    want_o, want_lse = _expected_split_nan(name, idx)
    assert want_lse.any() or want_o.any() or case == "nan-past-length"
    for backend, run in _split_backends().items():
        out, lse = run(_args(t, slots, lens))
        out, lse = out.cpu(), lse.cpu()
        assert torch.equal(torch.isnan(lse), want_lse), (backend, lse)
        assert torch.equal(torch.isnan(out), want_o), backend
        assert not torch.isinf(lse).any(), backend  # every row has keys: never reported empty
        ok = ~want_o
        torch.testing.assert_close(out[ok], clean_o.cpu()[ok], atol=1e-5, rtol=1e-5, msg=backend)
        ok = ~want_lse
        torch.testing.assert_close(lse[ok], clean_lse.cpu()[ok], atol=1e-5, rtol=1e-5, msg=backend)


def test_split_s_row_of_neg_inf_logits_is_nan_not_empty():
    """q = -inf * (all-positive keys): every logit -inf. The row has keys, so NaN, never 0 / -inf."""
    t, slots, lens = _split_case(seed=1)
    for key in ("k_pool", "k_live"):
        t[key] = t[key].abs() + 0.1
    t["q"][0, 0, 0, 4] = -INF
    for backend, run in _split_backends().items():
        out, lse = run(_args(t, slots, lens))
        assert torch.isnan(lse[0, 0, 0]) and torch.isnan(out[0, 0, 0]).all(), backend
        assert not torch.isnan(lse[1]).any() and not torch.isnan(lse[0, 1:]).any(), backend


def test_merge_states_nan_lse_propagates_on_both_backends():
    gen = torch.Generator().manual_seed(3)
    o = randn(3, 4, 2, 16, gen=gen)
    lse = randn(3, 4, 2, gen=gen, scale=3.0)
    lse[2, 3, 0] = lse[:, 3, 0].max() - 200.0  # row (3, 0): a live partial whose weight underflows...
    clean_o, clean_lse = R.merge_states(o, lse)
    o[2, 3, 0, 5] = NAN  # ...still carries its NaN (IEEE 0 * NaN)
    lse[1, 0, 0] = NAN  # row (0, 0): a NaN partial among finite ones
    lse[:, 2, 1] = torch.tensor([-INF, NAN, INF], device=lse.device)  # row (2, 1): NaN beats +inf and -inf
    want_lse = torch.zeros(4, 2, dtype=torch.bool)
    want_lse[0, 0] = want_lse[2, 1] = True
    want_o = want_lse[..., None].expand(4, 2, 16).clone()
    want_o[3, 0, 5] = True
    for backend in ("triton", "torch"):
        out, out_lse = merge_states(o, lse, backend=backend)
        assert torch.equal(torch.isnan(out_lse.cpu()), want_lse.cpu()), backend
        assert torch.equal(torch.isnan(out.cpu()), want_o.cpu()), backend
        ok = ~want_o.to(out.device)
        torch.testing.assert_close(out[ok], clean_o[ok], atol=1e-5, rtol=1e-5, msg=backend)
        ok = ~want_lse.to(out.device)
        torch.testing.assert_close(out_lse[ok], clean_lse[ok], atol=1e-5, rtol=1e-5, msg=backend)


@pytest.mark.parametrize("scale", [NAN, INF, -INF, 10**400], ids=["nan", "inf", "-inf", "int-past-float"])
def test_non_finite_sm_scale_is_a_value_error(scale):
    t, slots, lens = _split_case()
    q4 = randn(2, 3, HQ, D)
    k4 = randn(2, 3, HKV, D)
    for backend in ("triton", "torch"):
        with pytest.raises(ValueError, match="sm_scale must be finite"):
            split_s_attention(*_args(t, slots, lens), sm_scale=scale, backend=backend)
        with pytest.raises(ValueError, match="sm_scale must be finite"):
            chunk_attention_scores(q4, k4, sm_scale=scale, backend=backend)
        with pytest.raises(ValueError, match="sm_scale must be finite"):
            chunk_row_mass(q4, k4, k_extra=k4, sm_scale=scale, backend=backend)


def test_bool_sm_scale_is_a_type_error():
    t, slots, lens = _split_case()
    with pytest.raises(TypeError, match="sm_scale must be a float"):
        split_s_attention(*_args(t, slots, lens), sm_scale=True)


# ----------------------------------------------------------------------------- chunk scores

N, MS, E = 2, 3, 5
CLENS = [40, 22]


def _chunk_case(seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = randn(N, MS, HQ, D, gen=gen)
    k = randn(N, T, HKV, D, gen=gen)
    x = randn(N, E, HKV, D, gen=gen)
    qc = randn(N, T, HQ, D, gen=gen)  # the chunk tokens' own queries (chunk_row_mass)
    return dict(q=q, k=k, k_extra=x, qc=qc), torch.tensor(CLENS, dtype=torch.int32, device=DEVICE)


CHUNK_CASES = {
    "nan-key": ("k", (0, 10, 1, 3), NAN),
    "inf-key": ("k", (1, 21, 0, 3), INF),
    "neg-inf-key": ("k", (0, 3, 0, 0), -INF),
    "nan-extra-key": ("k_extra", (1, 2, 1, 2), NAN),
    "inf-q": ("q", (1, 0, 3, 5), INF),
    "nan-chunk-q": ("qc", (0, 7, 2, 1), NAN),
    "nan-past-length": ("k", (1, 30, 0, 0), NAN),
}


def _chunk_backends(lens):
    return {
        "triton": lambda q, k, x: chunk_attention_scores(q, k, lens, x, sm_scale=SCALE, backend="triton"),
        "triton-small-tiles": lambda q, k, x: chunk_attention_scores_launch(
            q, k, lens, x, SCALE, block_m=16, block_n=16
        ),
        "reference": lambda q, k, x: R.chunk_attention_scores(q, k, lens, x, sm_scale=SCALE),
    }


@pytest.mark.parametrize("case", list(CHUNK_CASES))
def test_chunk_scores_nonfinite_inputs_agree(case):
    """A non-finite logit NaNs its row's LSE and the whole mass of its (chunk, KV head), never dropped."""
    name, idx, value = CHUNK_CASES[case]
    t, lens = _chunk_case()
    clean = R.chunk_attention_scores(t["q"], t["k"], lens, t["k_extra"], sm_scale=SCALE)
    clean_rows = R.chunk_row_mass(t["qc"], t["k"], lens, t["k_extra"], sm_scale=SCALE)
    t[name][idx] = value
    # Independent NaN masks: scoring rows lse [N, M, Hq], (chunk, KV head) [N, Hkv], chunk rows [N, Hkv, T].
    lse_nan = torch.zeros(N, MS, HQ, dtype=torch.bool)
    head_nan = torch.zeros(N, HKV, dtype=torch.bool)
    row_nan = torch.zeros(N, HKV, T, dtype=torch.bool)
    n = idx[0]
    if name == "q":
        lse_nan[n, idx[1], idx[2]] = True
        head_nan[n, idx[2] // G] = True
    elif name == "qc":
        row_nan[n, idx[2] // G, idx[1]] = True
    elif name == "k_extra" or idx[1] < CLENS[n]:
        h = idx[2]
        lse_nan[n, :, h * G : (h + 1) * G] = True
        head_nan[n, h] = True
        row_nan[n, h, : CLENS[n]] = True
    for backend, run in _chunk_backends(lens).items():
        mass, extra, lse = (x.cpu() for x in run(t["q"], t["k"], t["k_extra"]))
        assert torch.equal(torch.isnan(lse), lse_nan), backend
        assert not torch.isinf(lse).any(), backend
        valid = torch.arange(T)[None, :] < torch.tensor(CLENS)[:, None]  # [N, T]: mass stays 0 past lens
        for got, want, cols in ((mass, clean[0], valid), (extra, clean[1], torch.ones(N, E, dtype=torch.bool))):
            nan = head_nan[..., None] & cols[:, None, :]
            assert torch.equal(torch.isnan(got), nan), backend
            torch.testing.assert_close(got[~nan], want.cpu()[~nan], atol=1e-5, rtol=1e-5, msg=backend)
        torch.testing.assert_close(lse[~lse_nan], clean[2].cpu()[~lse_nan], atol=1e-5, rtol=1e-5, msg=backend)
    for backend in ("triton", "torch"):
        got = chunk_row_mass(t["qc"], t["k"], lens, t["k_extra"], sm_scale=SCALE, backend=backend).cpu()
        assert torch.equal(torch.isnan(got), row_nan), backend
        torch.testing.assert_close(got[~row_nan], clean_rows.cpu()[~row_nan], atol=1e-5, rtol=1e-5, msg=backend)


@pytest.mark.parametrize("where", ["first-split", "last-split"])
def test_chunk_scores_key_splits_propagate_nan(where):
    """With pass 1 split over the keys (H200 plan, one chunk), a NaN split LSE still NaNs the row."""
    n, m, g, hkv, d, t = 1, 5, 2, 1, 16, 600
    gen = torch.Generator().manual_seed(11)
    q = randn(n, m, g * hkv, d, gen=gen)
    k = randn(n, t, hkv, d, gen=gen)
    assert plan_chunk_scores(n, m, g * hkv, hkv, d, t, q.element_size(), H200).n_splits == 2
    k[0, 5 if where == "first-split" else 590, 0, 2] = NAN
    q[0, 3, 1, 0] = INF  # row (3, 1) is NaN either way
    with assume_gpu(H200):
        mass, extra, lse = chunk_attention_scores(q, k, backend="triton")
    ref = R.chunk_attention_scores(q, k, sm_scale=0.25)
    for got, want in zip((mass, lse), (ref[0], ref[2]), strict=True):
        assert torch.isnan(got).all() and torch.isnan(want).all()
    assert extra.numel() == 0
