"""rope_qk (Triton, interpreter on CPU) vs the torch reference and the model's apply_rope."""

from __future__ import annotations

import pytest
import torch

import triton_kernels as tk
from dllm.model.rope import apply_rope, rope_cos_sin
from triton_kernels import reference as ref

from ._helpers import DEVICE, assert_rule, dtype_params, randn


@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("heads", [(6, 2), (7, 1)], ids=["gqa3", "hq7"])  # 7: a masked head tail
def test_rope_qk_matches_reference(dtype, heads):
    hq, hkv = heads
    b, n, d = 2, 5, 32
    gen = torch.Generator().manual_seed(hq)
    q = randn(b, n, hq, d, dtype=dtype, gen=gen)
    k = randn(b, n, hkv, d, dtype=dtype, gen=gen)
    pos = torch.tensor([[3, 4, 5, 9000, 31000], [0, 1, 2, 7, 40]], device=DEVICE)  # per token, ragged
    cos, sin = rope_cos_sin(pos, d, 1e6, attention_factor=1.1)
    qo, ko = tk.rope_qk(q, k, cos, sin, backend="triton")
    q32, k32 = ref.rope_qk(q.float(), k.float(), cos, sin)
    q_lp, k_lp = ref.rope_qk(q, k, cos, sin)
    assert qo.dtype == dtype and qo.shape == q.shape and ko.shape == k.shape
    assert_rule(qo, q32, q_lp, dtype, "q")
    assert_rule(ko, k32, k_lp, dtype, "k")
    # the model's own RoPE is the same operation
    tol = 2 * (q_lp - q32).abs().max().item() + 1e-5
    torch.testing.assert_close(qo.float(), apply_rope(q, cos, sin).float(), rtol=0, atol=tol)


def test_rope_qk_shared_table_and_strided_views():
    """An [L, D] table shared by the rows, and q/k that are head views of one fused projection."""
    b, n, hq, hkv, d = 2, 3, 4, 2, 16
    qkv = randn(b, n, (hq + 2 * hkv) * d)
    q = qkv[..., : hq * d].view(b, n, hq, d)
    k = qkv[..., hq * d : (hq + hkv) * d].view(b, n, hkv, d)
    cos, sin = rope_cos_sin(torch.arange(10, 10 + n, device=DEVICE), d, 1e4)  # [L, D]
    qo, ko = tk.rope_qk(q, k, cos, sin, backend="triton")
    qr, kr = ref.rope_qk(q, k, cos, sin)
    torch.testing.assert_close(qo, qr, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ko, kr, rtol=1e-6, atol=1e-6)
    assert qo.is_contiguous() and ko.is_contiguous()


def test_rope_qk_errors():
    q = torch.zeros(1, 2, 4, 8, device=DEVICE)
    k = torch.zeros(1, 2, 2, 8, device=DEVICE)
    cos = sin = torch.zeros(2, 8, device=DEVICE)
    with pytest.raises(ValueError, match="even"):
        tk.rope_qk(q[..., :7], k[..., :7], cos[:, :7], sin[:, :7])
    with pytest.raises(ValueError, match="k must be"):
        tk.rope_qk(q, torch.zeros(1, 3, 2, 8, device=DEVICE), cos, sin)
    with pytest.raises(TypeError, match="float32"):
        tk.rope_qk(q, k, cos.half(), sin)
    with pytest.raises(ValueError, match="cos must be"):
        tk.rope_qk(q, k, torch.zeros(3, 8, device=DEVICE), sin)
    with pytest.raises(TypeError, match="dtype"):
        tk.rope_qk(q, k.half(), cos, sin)
    with pytest.raises(ValueError, match="4-D"):
        tk.rope_qk(q[0], k, cos, sin)
