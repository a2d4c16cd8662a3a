"""Bad inputs raise clear TypeError / ValueError naming the problem (shared _validate checks)."""

from __future__ import annotations

import pytest
import torch

from triton_kernels import (
    check_segment_table,
    chunk_attention_scores,
    chunk_row_mass,
    merge_states,
    skip_value_checks,
    split_s_attention,
    topb_gather,
)

from ._helpers import DEVICE


def _split_args(**over):
    a = dict(
        q=torch.randn(2, 3, 4, 32, device=DEVICE),
        k_pool=torch.randn(3, 8, 2, 32, device=DEVICE),
        v_pool=torch.randn(3, 8, 2, 32, device=DEVICE),
        seg_slots=torch.tensor([[0, 1], [2, -1]], dtype=torch.int32, device=DEVICE),
        seg_lens=torch.tensor([[8, 1], [0, 0]], dtype=torch.int32, device=DEVICE),
        k_live=None,
        v_live=None,
    )
    a.update(over)
    return a


def _call_split(backend="torch", live_lens=None, **over):
    a = _split_args(**over)
    return split_s_attention(
        a["q"],
        a["k_pool"],
        a["v_pool"],
        a["seg_slots"],
        a["seg_lens"],
        a["k_live"],
        a["v_live"],
        live_lens=live_lens,
        backend=backend,
    )


def _d24():
    return dict(
        q=torch.randn(2, 3, 4, 24, device=DEVICE),
        k_pool=torch.randn(3, 8, 2, 24, device=DEVICE),
        v_pool=torch.randn(3, 8, 2, 24, device=DEVICE),
        k_live=torch.randn(2, 3, 2, 24, device=DEVICE),
        v_live=torch.randn(2, 3, 2, 24, device=DEVICE),
    )


def test_kernel_head_dim_limit():
    """The Triton kernels take D in multiples of 16; the torch path takes any D."""
    with pytest.raises(ValueError, match="D=24 is not supported; supported: any multiple of 16 from 16 to 256"):
        _call_split(backend="triton", **_d24())
    out, lse = _call_split(backend="torch", **_d24())
    assert out.shape == (2, 3, 4, 24) and torch.isfinite(lse).all()


I32 = dict(dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize(
    "over,exc,pattern",
    [
        (dict(q=torch.randn(2, 3, 4, 32, device=DEVICE).half()), TypeError, "dtype mismatch"),
        (dict(q=torch.randn(2, 3, 4, 32, device=DEVICE).double()), TypeError, "float32, float16, bfloat16"),
        (dict(q=torch.randn(2, 3, 3, 32, device=DEVICE)), ValueError, "multiple of KV heads"),
        (dict(q=torch.randn(2, 3, 4, 64, device=DEVICE)), ValueError, "head_dim mismatch"),
        (dict(seg_slots=torch.tensor([[0, 3], [2, -1]], **I32)), ValueError, r"seg_slots out of range.*P=3"),
        (dict(seg_slots=torch.tensor([[0, -2], [2, -1]], **I32)), ValueError, "seg_slots out of range"),
        (dict(seg_lens=torch.tensor([[9, 1], [0, 0]], **I32)), ValueError, r"seg_lens out of range.*T=8"),
        (dict(seg_lens=torch.tensor([[-1, 1], [0, 0]], **I32)), ValueError, "seg_lens out of range"),
        (dict(seg_lens=torch.tensor([[8, 1, 0], [0, 0, 0]], **I32)), ValueError, "seg_lens must have shape"),
        (dict(seg_lens=torch.tensor([[8, 1], [0, 0]], device=DEVICE)), TypeError, "share a dtype"),
        (dict(seg_slots=torch.tensor([[0.0, 1.0], [2.0, -1.0]], device=DEVICE)), TypeError, "int32 or int64"),
        (dict(seg_slots=torch.tensor([[0, 1]], **I32)), ValueError, "seg_slots must have shape"),
        (dict(seg_slots=torch.tensor([0, 1], **I32)), ValueError, r"seg_slots must be 2-D"),
        (
            dict(q=torch.randn(2, 3, 4, 32, 2, device=DEVICE)[..., 0]),
            ValueError,
            "contiguous in its last dim",
        ),
        (dict(k_live=torch.randn(2, 3, 2, 32, device=DEVICE)), ValueError, "both k_live and v_live"),
        (
            dict(k_live=torch.randn(2, 4, 2, 32, device=DEVICE), v_live=torch.randn(2, 4, 2, 32, device=DEVICE)),
            ValueError,
            "k_live must have shape",
        ),
        (dict(q=torch.randn(3, 4, 32, device=DEVICE)), ValueError, r"q must be 4-D"),
        (dict(q=[1, 2]), TypeError, "must be a torch.Tensor"),
    ],
)
def test_split_s_errors(over, exc, pattern):
    with pytest.raises(exc, match=pattern):
        _call_split(**over)


@pytest.mark.parametrize(
    "live_lens,exc,pattern",
    [
        (torch.tensor([3, 4], dtype=torch.int32), ValueError, r"live_lens out of range.*M=3"),
        (torch.tensor([-1, 0], dtype=torch.int32), ValueError, "live_lens out of range"),
        (torch.tensor([3, 3, 3], dtype=torch.int32), ValueError, "live_lens must have shape"),
        (torch.tensor([3.0, 3.0]), TypeError, "live_lens must be int32 or int64"),
    ],
)
def test_live_lens_errors(live_lens, exc, pattern):
    with pytest.raises(exc, match=pattern):
        _call_split(live_lens=live_lens.to(DEVICE))


def test_check_segment_table_once_then_skip():
    """A cache validates its table once; inside skip_value_checks the per-call check is gone."""
    a = _split_args()
    check_segment_table(a["seg_slots"], a["seg_lens"], 3, 8, torch.tensor([3, 1], device=DEVICE), 3)
    with pytest.raises(ValueError, match=r"seg_slots out of range.*P=2"):
        check_segment_table(a["seg_slots"], a["seg_lens"], 2, 8)
    with pytest.raises(ValueError, match=r"seg_lens out of range.*T=7"):
        check_segment_table(a["seg_slots"], a["seg_lens"], 3, 7)
    with pytest.raises(ValueError, match=r"live_lens out of range.*M=2"):
        check_segment_table(a["seg_slots"], a["seg_lens"], 3, 8, torch.tensor([3, 1], device=DEVICE), 2)
    with pytest.raises(ValueError, match="seg_lens must have shape"):
        check_segment_table(a["seg_slots"], a["seg_lens"][:, :1], 3, 8)
    bad = torch.tensor([[0, 1], [2, 5]], dtype=torch.int32, device=DEVICE)  # slot 5 >= P, length 0 there
    lens = torch.tensor([[8, 1], [0, 0]], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="seg_slots out of range"):
        _call_split(seg_slots=bad, seg_lens=lens)
    with skip_value_checks():
        _call_split(seg_slots=bad.clamp(max=2), seg_lens=lens)  # valid data, no check: runs


def test_device_mismatch():
    meta = torch.empty(2, 3, 4, 32, device="meta")
    with pytest.raises(ValueError, match="device mismatch"):
        _call_split(q=meta)


def test_merge_states_errors():
    o = torch.randn(3, 5, 2, 32, device=DEVICE)
    with pytest.raises(ValueError, match=r"lse must have shape"):
        merge_states(o, torch.randn(3, 5, 3, device=DEVICE))
    with pytest.raises(ValueError, match="at least 3-D"):
        merge_states(o[0, 0], torch.randn(2, device=DEVICE))
    with pytest.raises(TypeError, match="dtype"):
        merge_states(o.long(), torch.randn(3, 5, 2, device=DEVICE))
    with pytest.raises(ValueError, match="contiguous in its last dim"):
        merge_states(torch.randn(3, 5, 2, 32, 2, device=DEVICE)[..., 0], torch.randn(3, 5, 2, device=DEVICE))


def test_chunk_scores_errors():
    q = torch.randn(2, 5, 4, 32, device=DEVICE)
    k = torch.randn(2, 9, 2, 32, device=DEVICE)
    with pytest.raises(ValueError, match=r"lens out of range.*T=9"):
        chunk_attention_scores(q, k, torch.tensor([10, 1], device=DEVICE))
    with pytest.raises(ValueError, match="lens out of range"):
        chunk_attention_scores(q, k, torch.tensor([-1, 1], device=DEVICE))
    with pytest.raises(ValueError, match="lens must have shape"):
        chunk_attention_scores(q, k, torch.tensor([1, 1, 1], device=DEVICE))
    with pytest.raises(TypeError, match="int32 or int64"):
        chunk_attention_scores(q, k, torch.tensor([1.0, 1.0], device=DEVICE))
    with pytest.raises(ValueError, match="k_extra must be"):
        chunk_attention_scores(q, k, None, torch.randn(2, 3, 1, 32, device=DEVICE))
    with pytest.raises(ValueError, match="chunks"):
        chunk_attention_scores(q, k[:1])
    with pytest.raises(TypeError, match="dtype mismatch"):
        chunk_attention_scores(q, k.half())
    with pytest.raises(ValueError, match="multiple of KV heads"):
        chunk_attention_scores(q[:, :, :3], k)
    with pytest.raises(ValueError, match="one query per chunk token"):
        chunk_row_mass(q, k, None, k)
    with pytest.raises(TypeError, match="sm_scale"):
        chunk_attention_scores(q, k, sm_scale="0.1")


def test_topb_errors():
    s = torch.randn(2, 2, 9, device=DEVICE)
    k = torch.randn(2, 9, 2, 32, device=DEVICE)
    with pytest.raises(ValueError, match="b .* must be >= 1"):
        topb_gather(s, k, k, 0)
    with pytest.raises(TypeError, match="b must be an int"):
        topb_gather(s, k, k, 2.0)
    with pytest.raises(ValueError, match="pool_kernel must be odd"):
        topb_gather(s, k, k, 2, pool_kernel=4)
    with pytest.raises(ValueError, match=r"lens out of range.*T=9"):
        topb_gather(s, k, k, 2, lens=torch.tensor([10, 3], device=DEVICE))
    with pytest.raises(ValueError, match="k must have shape"):
        topb_gather(s, k[:, :8], k[:, :8], 2)
    with pytest.raises(TypeError, match="dtype mismatch"):
        topb_gather(s, k, k.half(), 2)
    with pytest.raises(TypeError, match="keep_first must be a bool"):
        topb_gather(s, k, k, 2, keep_first=1)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_topb_rejects_nan_scores(backend):
    s = torch.randn(2, 2, 9, device=DEVICE)
    k = torch.randn(2, 9, 2, 32, device=DEVICE)
    s[1, 0, 4] = float("nan")
    with pytest.raises(ValueError, match=r"NaN at 1 valid token\(s\) \(first: chunk 1, KV head 0, token 4\)"):
        topb_gather(s, k, k, 3, backend=backend)
    lens = torch.tensor([9, 4], device=DEVICE)  # the NaN sits past chunk 1's valid tokens: ignored
    got = topb_gather(s, k, k, 3, lens=lens, backend=backend)
    assert not torch.isnan(got[0]).any() and got[3].tolist() == [3, 3]


def test_bad_backend_name():
    with pytest.raises(ValueError, match="backend must be"):
        merge_states(torch.randn(2, 3, 16, device=DEVICE), torch.randn(2, 3, device=DEVICE), backend="cuda")
