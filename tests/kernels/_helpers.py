"""Shared helpers of the kernel tests: device choice and inputs. The accuracy rule, the error
measure and the low-precision attention live in :mod:`triton_kernels.testing` (shared with
``bench/kernels/bench_kernels.py``) and are re-exported here."""

from __future__ import annotations

import pytest
import torch

from triton_kernels.testing import FLOOR, assert_rule, lowp_attention, max_err, split_s_dense

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ON_GPU = DEVICE.type == "cuda"
# Interpreter-friendly dtypes on CPU; bf16 only where it can be computed natively.
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if ON_GPU else [])
LOW_DTYPES = [torch.float16] + ([torch.bfloat16] if ON_GPU else [])
gpu_only = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")

# Every kernel the ops launch: the compile gate compiles each (test_gpu_compile.py) and the direct launch
# check launches each through the stand-in driver (tests/test_direct_launch_driver.py).
KERNELS = {
    "_split_s_partial_kernel",
    "_merge_states_kernel",
    "_row_lse_kernel",
    "_column_mass_kernel",
    "_row_mass_kernel",
    "_select_topb_kernel",
    "_gather_rows_kernel",
    "_add_rms_norm_kernel",
    "_rope_qk_kernel",
    "_swiglu_kernel",
}

__all__ = [
    "DEVICE",
    "ON_GPU",
    "DTYPES",
    "KERNELS",
    "LOW_DTYPES",
    "FLOOR",
    "gpu_only",
    "dtype_params",
    "randn",
    "assert_rule",
    "lowp_attention",
    "max_err",
    "split_s_dense",
]


def dtype_params():
    """fp32/fp16 everywhere; bf16 marked gpu (the interpreter cannot compute in bf16)."""
    out = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.float16, id="fp16")]
    out.append(pytest.param(torch.bfloat16, id="bf16", marks=[pytest.mark.gpu, gpu_only]))
    return out


def randn(*shape, dtype=torch.float32, scale=1.0, gen=None):
    return (torch.randn(*shape, generator=gen) * scale).to(dtype=dtype, device=DEVICE)
