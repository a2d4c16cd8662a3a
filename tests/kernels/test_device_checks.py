"""The no-sync check policy: on CUDA an op reads no index value on the host; its kernels
guard every index (a bad slot or length reads nothing), make the affected rows NaN and set a device
error word that ``check_errors`` raises from. Run here through the interpreter, with the host checks
off (as on CUDA), and against the torch reference for the rows that are valid."""

from __future__ import annotations

import pytest
import torch

import triton_kernels as tk
from triton_kernels import _dispatch
from triton_kernels import reference as R
from triton_kernels.split_s import split_s_launch

from ._helpers import DEVICE, max_err

I32 = dict(dtype=torch.int32, device=DEVICE)


@pytest.fixture(autouse=True)
def _clean_error_word():
    """Every test starts and ends with a clear error word (a leftover would fail the next one)."""
    tk.check_errors() if not _dispatch._ERROR_WORDS else [w.zero_() for w in _dispatch._ERROR_WORDS.values()]
    yield
    for w in _dispatch._ERROR_WORDS.values():
        w.zero_()


def _split_case(seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 3, 4, 16, generator=g).to(DEVICE)
    kp = torch.randn(3, 8, 2, 16, generator=g).to(DEVICE)
    vp = torch.randn(3, 8, 2, 16, generator=g).to(DEVICE)
    kl = torch.randn(2, 3, 2, 16, generator=g).to(DEVICE)
    vl = torch.randn(2, 3, 2, 16, generator=g).to(DEVICE)
    return q, kp, vp, kl, vl


GOOD_SLOTS = [[0, 1], [2, -1]]
GOOD_LENS = [[8, 5], [6, 0]]


@pytest.mark.parametrize(
    "slots,lens,live,what",
    [
        ([[0, 1], [3, -1]], GOOD_LENS, None, "seg_slots entry outside"),  # slot = P
        ([[0, 1], [-2, -1]], GOOD_LENS, None, "seg_slots entry outside"),  # slot < -1: was skipped silently
        ([[0, 1], [2, 1]], [[8, 5], [9, 3]], None, "seg_lens entry outside"),  # len = T + 1
        ([[0, 1], [2, -1]], [[8, 5], [-1, 0]], None, "seg_lens entry outside"),
        (GOOD_SLOTS, GOOD_LENS, [3, 4], "live_lens entry outside"),  # live len = M + 1
    ],
)
@pytest.mark.parametrize("split_len", [None, 1], ids=["plan", "partial-per-segment"])
def test_split_s_bad_row_is_nan_and_reported(slots, lens, live, what, split_len):
    """Every partial that holds the bad entry is NaN, so the merged row is too; the other row is exact."""
    q, kp, vp, kl, vl = _split_case()
    s, n = torch.tensor(slots, **I32), torch.tensor(lens, **I32)
    live_lens = None if live is None else torch.tensor(live, **I32)
    with tk.skip_value_checks():  # the CUDA default: no host read
        if split_len is None:
            out, lse = tk.split_s_attention(q, kp, vp, s, n, kl, vl, live_lens=live_lens, backend="triton")
        else:
            out, lse = split_s_launch(q, kp, vp, s, n, kl, vl, 0.25, live_lens, segs_per_prog=1)  # + merge
    assert torch.isnan(out[1]).all() and torch.isnan(lse[1]).all()  # the bad row: NaN, never plausible
    good_live = None if live is None else torch.tensor([3, 3], **I32)
    scale = 0.25 if split_len is not None else None
    ref, ref_lse = R.split_s_attention(
        q, kp, vp, torch.tensor(GOOD_SLOTS, **I32), torch.tensor(GOOD_LENS, **I32), kl, vl,
        sm_scale=scale, live_lens=good_live,
    )  # fmt: skip
    assert max_err(out[0], ref[0]) <= 1e-5 and max_err(lse[0], ref_lse[0]) <= 1e-5  # the good row is intact
    with pytest.raises(ValueError, match=what):
        tk.check_errors()
    tk.check_errors()  # reported once, then cleared


def test_chunk_scores_bad_length_is_nan_and_reported():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, 4, 16, generator=g).to(DEVICE)
    k = torch.randn(2, 8, 2, 16, generator=g).to(DEVICE)
    x = torch.randn(2, 2, 2, 16, generator=g).to(DEVICE)
    bad = torch.tensor([8, 9], **I32)
    with tk.skip_value_checks():
        mass, extra, lse = tk.chunk_attention_scores(q, k, bad, x, backend="triton")
    assert torch.isnan(mass[1]).all() and torch.isnan(extra[1]).all() and torch.isnan(lse[1]).all()
    want = R.chunk_attention_scores(q, k, torch.tensor([8, 8], **I32), x)
    assert max_err(mass[0], want[0][0]) <= 1e-5 and max_err(lse[0], want[2][0]) <= 1e-5
    with pytest.raises(ValueError, match="chunk_attention_scores / chunk_row_mass: a lens entry outside"):
        tk.check_errors()
    rows_q = torch.randn(2, 8, 4, 16, generator=g).to(DEVICE)
    with tk.skip_value_checks():
        rows = tk.chunk_row_mass(rows_q, k, torch.tensor([-1, 8], **I32), x, backend="triton")
    assert torch.isnan(rows[0]).all() and not torch.isnan(rows[1]).any()
    with pytest.raises(ValueError, match="a lens entry outside"):
        tk.check_errors()


BAD_TABLES = [
    ([[0, 1], [3, -1]], GOOD_LENS, None, "seg_slots entry outside"),
    ([[0, 1], [-2, -1]], GOOD_LENS, None, "seg_slots entry outside"),
    ([[0, 1], [2, 1]], [[8, 5], [9, 3]], None, "seg_lens entry outside"),
    ([[0, 1], [2, -1]], [[8, 5], [-1, 0]], None, "seg_lens entry outside"),
    (GOOD_SLOTS, GOOD_LENS, [3, 4], "live_lens entry outside"),
    (GOOD_SLOTS, GOOD_LENS, [-1, 3], "live_lens entry outside"),
]


@pytest.mark.parametrize("slots,lens,live,what", BAD_TABLES)
def test_unchecked_torch_path_is_the_kernels_behaviour(slots, lens, live, what):
    """With the host checks off, the torch backend gave plausible numbers for a bad slot or length (a
    slot -2 skipped, a length past T cut to T, a negative one counted from the end) or an IndexError;
    now it does what the kernel does: the bad batch row NaN, the other exact, the same error word."""
    q, kp, vp, kl, vl = _split_case()
    s, n = torch.tensor(slots, **I32), torch.tensor(lens, **I32)
    live_lens = None if live is None else torch.tensor(live, **I32)
    results = {}
    for backend in ("triton", "torch"):
        with tk.skip_value_checks():
            results[backend] = tk.split_s_attention(q, kp, vp, s, n, kl, vl, live_lens=live_lens, backend=backend)
        with pytest.raises(ValueError, match=what):
            tk.check_errors()
    (out_k, lse_k), (out_t, lse_t) = results["triton"], results["torch"]
    bad = 1 if live is None or live[1] > 3 else 0
    assert torch.isnan(out_t[bad]).all() and torch.isnan(lse_t[bad]).all()
    assert torch.equal(torch.isnan(out_t), torch.isnan(out_k)) and torch.equal(torch.isnan(lse_t), torch.isnan(lse_k))
    good = 1 - bad
    assert max_err(out_t[good], out_k[good]) <= 1e-5 and max_err(lse_t[good], lse_k[good]) <= 1e-5


@pytest.mark.parametrize("lens, bad", [([8, 9], 1), ([-1, 8], 0)], ids=["past-T", "negative"])
def test_unchecked_torch_chunk_scores_are_the_kernels_behaviour(lens, bad):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, 4, 16, generator=g).to(DEVICE)
    rows_q = torch.randn(2, 8, 4, 16, generator=g).to(DEVICE)
    k = torch.randn(2, 8, 2, 16, generator=g).to(DEVICE)
    x = torch.randn(2, 2, 2, 16, generator=g).to(DEVICE)
    n = torch.tensor(lens, **I32)
    for op, query in ((tk.chunk_attention_scores, q), (tk.chunk_row_mass, rows_q)):
        got = {}
        for backend in ("triton", "torch"):
            with tk.skip_value_checks():
                out = op(query, k, n, x, backend=backend)
            got[backend] = out if isinstance(out, tuple) else (out,)
            with pytest.raises(ValueError, match="chunk_attention_scores / chunk_row_mass: a lens entry outside"):
                tk.check_errors()
        for a, b in zip(got["torch"], got["triton"], strict=True):
            assert torch.equal(torch.isnan(a), torch.isnan(b)) and torch.isnan(a[bad]).all()
            assert max_err(torch.nan_to_num(a), torch.nan_to_num(b)) <= 1e-5


def test_topb_nan_score_or_bad_length_is_nan_and_reported():
    g = torch.Generator().manual_seed(2)
    scores = torch.randn(3, 2, 10, generator=g).to(DEVICE)
    k = torch.randn(3, 10, 2, 16, generator=g).to(DEVICE)
    scores[0, 1, 4] = float("nan")
    lens = torch.tensor([10, 11, 6], **I32)
    scores[2, 0, 8] = float("nan")  # beyond lens[2]: ignored
    with tk.skip_value_checks():
        k_out, v_out, idx, kept = tk.topb_gather(scores, k, k, 4, lens=lens, backend="triton")
    assert torch.isnan(k_out[:2]).all() and torch.isnan(v_out[:2]).all()
    want = R.topb_gather(scores[2:], k[2:], k[2:], 4, lens=lens[2:])
    assert max_err(k_out[2], want[0][0]) == 0 and torch.equal(idx[2], want[2][0])
    # a bad chunk keeps nothing: idx -1, kept 0 (not a plausible idx and kept 4)
    assert (idx[:2] == -1).all() and kept[:2].tolist() == [0, 0]
    assert kept[2].item() == want[3][0].item() == 4
    with pytest.raises(ValueError, match="topb_gather: a lens entry outside"):
        tk.check_errors()


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_topb_unchecked_bad_lengths_are_flagged_by_either_backend(backend):
    """Inside skip_value_checks the torch backend once returned plausible output for lens=-1 (kept -1,
    idx of garbage) and a RuntimeError for lens > T with b > T; now both backends apply the same guard:
    NaN K/V, idx -1, kept 0 for the bad chunks, the error word set, the good chunk as the reference."""
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(4, 2, 6, generator=g).to(DEVICE)
    k = torch.randn(4, 6, 2, 8, generator=g).to(DEVICE)
    scores[3, 0, 1] = float("nan")
    lens = torch.tensor([-1, 5, 7, 6], **I32)
    with tk.skip_value_checks():
        k_out, v_out, idx, kept = tk.topb_gather(scores, k, k, 8, lens=lens, backend=backend)
    bad = [0, 2, 3]
    assert torch.isnan(k_out[bad]).all() and torch.isnan(v_out[bad]).all()
    assert (idx[bad] == -1).all() and kept[bad].tolist() == [0, 0, 0]
    want = R.topb_gather(scores[1:2], k[1:2], k[1:2], 8, lens=lens[1:2])
    assert max_err(k_out[1], want[0][0]) == 0 and torch.equal(idx[1], want[2][0]) and kept[1].item() == 5
    with pytest.raises(ValueError, match="topb_gather"):
        tk.check_errors()


def test_default_policy_is_host_checks_off_cuda_only(monkeypatch):
    """No host read by default on CUDA; on CPU and for the torch references, yes; env and context managers."""
    monkeypatch.delenv("PREFILLING_DLLM_CHECK_VALUES", raising=False)
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert not _dispatch.check_values_enabled(cuda)
    assert _dispatch.check_values_enabled(cpu) and _dispatch.check_values_enabled(None)
    with tk.eager_value_checks():
        assert _dispatch.check_values_enabled(cuda)
        with tk.skip_value_checks():
            assert not _dispatch.check_values_enabled(cpu)
    monkeypatch.setenv("PREFILLING_DLLM_CHECK_VALUES", "1")
    assert _dispatch.check_values_enabled(cuda)
    monkeypatch.setenv("PREFILLING_DLLM_CHECK_VALUES", "0")
    assert not _dispatch.check_values_enabled(cpu)


@pytest.mark.parametrize("name", ["cuda", "torch.device"])
def test_an_unindexed_device_means_the_current_one(monkeypatch, name):
    """The words are keyed by the indexed device a kernel ran on (cuda:0): check_errors("cuda") must find it."""
    bit = next(iter(_dispatch.ERROR_MEANINGS))
    word = torch.tensor([bit], dtype=torch.int32)
    monkeypatch.setattr(_dispatch, "_ERROR_WORDS", {torch.device("cuda", 0): word})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # current device: 0
    device = "cuda" if name == "cuda" else torch.device("cuda")
    with pytest.raises(ValueError, match="a kernel on cuda:0 met a bad index"):
        tk.check_errors(device)
    assert int(word.item()) == 0  # cleared once reported
    tk.check_errors(device)
    tk.check_errors("cuda:1")  # another device's word is not read


@pytest.mark.parametrize("word", ["on", "off", "2"])
def test_an_unknown_check_values_word_is_refused(monkeypatch, word):
    monkeypatch.setenv("PREFILLING_DLLM_CHECK_VALUES", word)
    with pytest.raises(ValueError, match=f"PREFILLING_DLLM_CHECK_VALUES must be .* got '{word}'"):
        _dispatch.values_checked("cuda")
    monkeypatch.setenv("PREFILLING_DLLM_CHECK_VALUES", " Auto ")
    assert _dispatch.values_checked("cuda") is False and _dispatch.values_checked("cpu") is True
