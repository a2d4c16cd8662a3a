"""Traps of a kernel user: SDPA's [B, H, M, D] layout passed where the
ops read token-major tensors, head dim 0, and numpy / torch integer scalars for ``b``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import triton_kernels as tk

from ._helpers import DEVICE, max_err


def _gen():
    return torch.Generator().manual_seed(3)


def _split_inputs(b=2, m=6, hq=4, hkv=2, d=16):
    g = _gen()
    q = torch.randn(b, m, hq, d, generator=g).to(DEVICE)
    kp = torch.randn(3, 8, hkv, d, generator=g).to(DEVICE)
    vp = torch.randn(3, 8, hkv, d, generator=g).to(DEVICE)
    slots = torch.tensor([[0, 1], [2, -1]][:b], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([[8, 3], [5, 0]][:b], dtype=torch.int32, device=DEVICE)
    kl = torch.randn(b, m, hkv, d, generator=g).to(DEVICE)
    vl = torch.randn(b, m, hkv, d, generator=g).to(DEVICE)
    return q, kp, vp, slots, lens, kl, vl


def test_sdpa_layout_query_is_caught_by_the_live_keys():
    """q built as SDPA's [B, Hq, M, D] beside token-major live K/V: the error names q and the layout."""
    q, kp, vp, slots, lens, kl, vl = _split_inputs()
    with pytest.raises(ValueError, match=r"q \(2, 4, 6, 16\) looks like SDPA's \[B, Hq, M, D\].*") as e:
        tk.split_s_attention(q.transpose(1, 2), kp, vp, slots, lens, kl, vl)
    assert "Expected layout: q [B, M, Hq, D]" in str(e.value)


def test_sdpa_layout_live_keys_are_named():
    q, kp, vp, slots, lens, kl, vl = _split_inputs()
    with pytest.raises(ValueError, match=r"k_live \(2, 2, 6, 16\) looks like SDPA's \[B, Hkv, M, D\]"):
        tk.split_s_attention(q, kp, vp, slots, lens, kl.transpose(1, 2), vl.transpose(1, 2))


def test_every_split_s_shape_error_states_the_layout():
    q, kp, vp, slots, lens, kl, vl = _split_inputs()
    with pytest.raises(ValueError, match=r"multiple of KV heads.*Expected layout: q \[B, M, Hq, D\].*SDPA"):
        tk.split_s_attention(q[:, :, :3], kp, vp, slots, lens)  # Hq = 3 with Hkv = 2
    with pytest.raises(ValueError, match=r"Expected layout: .*k_pool/v_pool \[P, T, Hkv, D\]"):
        tk.split_s_attention(q, kp, vp[:2], slots, lens)


def test_sdpa_layout_chunk_queries_and_extra_keys_are_named():
    g = _gen()
    q = torch.randn(2, 12, 4, 16, generator=g).to(DEVICE)  # [N, T, Hq, D]
    k = torch.randn(2, 12, 2, 16, generator=g).to(DEVICE)
    x = torch.randn(2, 3, 2, 16, generator=g).to(DEVICE)
    with pytest.raises(ValueError, match=r"q \(2, 4, 12, 16\) looks like SDPA's \[N, Hq, T, D\]"):
        tk.chunk_row_mass(q.transpose(1, 2), k, None, x)
    with pytest.raises(ValueError, match=r"k_extra \(2, 2, 3, 16\) looks like SDPA's \[N, Hkv, E, D\]"):
        tk.chunk_attention_scores(q[:, :5], k, None, x.transpose(1, 2))


def test_topb_axis_orders_are_named_in_the_error():
    """scores [N, Hkv, T] beside k [N, T, Hkv, D] (a documented reason); one built in the other's order
    is named, whichever it was."""
    g = _gen()
    scores = torch.randn(2, 3, 10, generator=g).to(DEVICE)  # [N, Hkv, T]
    k = torch.randn(2, 10, 3, 16, generator=g).to(DEVICE)  # [N, T, Hkv, D]
    hint = r"share one axis order: scores are \[N, Hkv, T\] and k/v \[N, T, Hkv, D\]"
    with pytest.raises(ValueError, match=hint) as e:
        tk.topb_gather(scores, k.transpose(1, 2), k.transpose(1, 2), 4)
    assert "Expected layout: scores [N, Hkv, T]" in str(e.value)
    with pytest.raises(ValueError, match=hint):
        tk.topb_gather(scores.transpose(1, 2), k, k, 4)


@pytest.mark.parametrize("op", ["split_s", "scores", "row_mass"])
def test_head_dim_zero_is_a_value_error(op):
    """D = 0 was a ZeroDivisionError from the default scale 1/sqrt(D)."""
    q, kp, vp, slots, lens, _, _ = _split_inputs(d=0)
    with pytest.raises(ValueError, match="head_dim D must be >= 1, got D=0"):
        if op == "split_s":
            tk.split_s_attention(q, kp, vp, slots, lens)
        elif op == "scores":
            tk.chunk_attention_scores(q, kp[:2])
        else:
            tk.chunk_row_mass(q[:, :1].expand(2, 8, 4, 0), kp[:2], None, kp[:2])


@pytest.mark.parametrize("b", [np.int64(3), np.int32(3), torch.tensor(3), torch.tensor(3, dtype=torch.int32)])
def test_topb_takes_numpy_and_torch_integers(b):
    g = _gen()
    scores = torch.randn(2, 2, 10, generator=g).to(DEVICE)
    k = torch.randn(2, 10, 2, 16, generator=g).to(DEVICE)
    want = tk.topb_gather(scores, k, k, 3, pool_kernel=3)
    got = tk.topb_gather(scores, k, k, b, pool_kernel=np.int64(3))
    assert got[0].shape == (2, 3, 2, 16)
    for a, w in zip(got, want, strict=True):
        assert max_err(a, w) == 0


@pytest.mark.parametrize("b", [True, np.bool_(True), 3.0, np.float64(3.0), torch.tensor(3.0), torch.tensor(True), "3"])
def test_topb_refuses_bools_and_floats(b):
    scores = torch.randn(2, 2, 10, device=DEVICE)
    k = torch.randn(2, 10, 2, 16, device=DEVICE)
    with pytest.raises(TypeError, match="b must be an int"):
        tk.topb_gather(scores, k, k, b)
