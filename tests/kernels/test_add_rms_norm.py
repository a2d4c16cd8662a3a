"""add_rms_norm (Triton, interpreter on CPU) vs the torch reference, flash-attention's error-vs-torch rule."""

from __future__ import annotations

import pytest
import torch

import triton_kernels as tk
from triton_kernels import reference as ref

from ._helpers import DEVICE, assert_rule, dtype_params, randn


@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("with_residual", [True, False], ids=["residual", "plain"])
@pytest.mark.parametrize("hidden", [96, 200])  # a power of two's neighbour and a masked tail
def test_add_rms_norm_matches_reference(dtype, with_residual, hidden):
    gen = torch.Generator().manual_seed(hidden)
    x = randn(2, 5, hidden, dtype=dtype, gen=gen, scale=3.0)
    res = randn(2, 5, hidden, dtype=dtype, gen=gen) if with_residual else None
    w = randn(hidden, dtype=dtype, gen=gen)
    eps = 1e-6
    y, s = tk.add_rms_norm(x, w, eps, res, backend="triton")
    y32, s32 = ref.add_rms_norm(x.float(), w.float(), eps, None if res is None else res.float())
    y_lp, s_lp = ref.add_rms_norm(x, w, eps, res)
    assert y.dtype == dtype and y.shape == x.shape
    assert_rule(y, y32, y_lp, dtype, "y")
    if with_residual:
        assert s.dtype == dtype and s.shape == x.shape
        torch.testing.assert_close(s, s_lp, rtol=0, atol=0)  # one rounded add: exact
    else:
        assert s is None


def test_add_rms_norm_strided_rows_and_zero_row():
    """Rows with a stride (a slice of a wider buffer) and an all-zero row (eps keeps it finite)."""
    wide = randn(4, 160)
    x = wide[:, :64]
    x[1] = 0.0
    w = randn(64)
    y, _ = tk.add_rms_norm(x, w, 1e-5, backend="triton")
    want, _ = ref.add_rms_norm(x, w, 1e-5)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    assert (y[1] == 0).all()


def test_add_rms_norm_errors():
    x = torch.zeros(2, 8, device=DEVICE)
    w = torch.ones(8, device=DEVICE)
    with pytest.raises(ValueError, match="weight"):
        tk.add_rms_norm(x, torch.ones(7, device=DEVICE), 1e-6)
    with pytest.raises(ValueError, match="residual"):
        tk.add_rms_norm(x, w, 1e-6, torch.zeros(2, 7, device=DEVICE))
    with pytest.raises(TypeError, match="dtype"):
        tk.add_rms_norm(x, w, 1e-6, torch.zeros(2, 8, dtype=torch.float16, device=DEVICE))
    with pytest.raises(TypeError, match="dtype"):
        tk.add_rms_norm(x.long(), w, 1e-6)
    with pytest.raises(ValueError, match="eps"):
        tk.add_rms_norm(x, w, float("nan"))
    with pytest.raises(ValueError, match="contiguous"):
        tk.add_rms_norm(torch.zeros(8, 2, device=DEVICE).t(), w, 1e-6)
    tk.add_rms_norm(x, w, 1)  # an int eps is fine; True after it must not pass as the same call
    with pytest.raises(ValueError, match="eps must be a finite float >= 0, got True"):
        tk.add_rms_norm(x, w, True)


@pytest.mark.parametrize("shape", [(2, 3, 0), (0, 0), (0, 4)], ids=["hidden-0", "no-row-hidden-0", "no-row"])
@pytest.mark.parametrize("with_residual", [True, False], ids=["residual", "plain"])
def test_add_rms_norm_empty_matches_the_torch_backend(shape, with_residual):
    """A hidden size of 0 is an empty result on both backends (the Triton path once failed in
    ``reshape(-1, 0)``, which is ambiguous for 0 elements, while torch returned empty tensors)."""
    x = torch.zeros(shape, device=DEVICE)
    res = torch.zeros(shape, device=DEVICE) if with_residual else None
    w = torch.ones(shape[-1], device=DEVICE)
    outs = {b: tk.add_rms_norm(x, w, 1e-6, res, backend=b) for b in ("torch", "triton")}
    for y, s in outs.values():
        assert y.shape == x.shape and y.dtype == x.dtype
        assert (s is None) == (res is None) and (s is None or (s.shape == x.shape and s.dtype == x.dtype))
