"""swiglu (Triton, interpreter on CPU) vs the torch reference, separate and fused gate/up inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import triton_kernels as tk
from triton_kernels import reference as ref

from ._helpers import DEVICE, assert_rule, dtype_params, randn


@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("fused", [False, True], ids=["separate", "fused"])
def test_swiglu_matches_reference(dtype, fused, monkeypatch):
    from triton_kernels import glu as mod

    monkeypatch.setattr(mod, "BLOCK_I", 64)  # several column blocks and a masked tail at I = 150
    gen = torch.Generator().manual_seed(int(fused))
    i = 150
    g = randn(3, 4, i, dtype=dtype, gen=gen, scale=4.0)
    u = randn(3, 4, i, dtype=dtype, gen=gen)
    if fused:
        gu = torch.cat([g, u], dim=-1)
        out = tk.swiglu(gu, backend="triton")
        out_lp = ref.swiglu(gu)
    else:
        out = tk.swiglu(g, u, backend="triton")
        out_lp = ref.swiglu(g, u)
    out32 = F.silu(g.float()) * u.float()
    assert out.dtype == dtype and out.shape == g.shape and out.is_contiguous()
    assert_rule(out, out32, out_lp, dtype, "swiglu")


def test_swiglu_errors():
    g = torch.zeros(2, 6, device=DEVICE)
    with pytest.raises(ValueError, match="up"):
        tk.swiglu(g, torch.zeros(2, 5, device=DEVICE))
    with pytest.raises(ValueError, match="even"):
        tk.swiglu(g[:, :5])
    with pytest.raises(TypeError, match="dtype"):
        tk.swiglu(g, g.half())
    with pytest.raises(ValueError, match="contiguous"):
        tk.swiglu(torch.zeros(6, 2, device=DEVICE).t(), torch.zeros(2, 6, device=DEVICE))
