"""Backend choice, output allocation and launch helpers shared by the ops.

Dispatch rule (DESIGN section 2), in order of precedence:

1. the ``backend=`` keyword of a public op (``"triton"``, ``"torch"`` or ``None``);
2. the environment variable ``PREFILLING_DLLM_BACKEND`` (``triton`` | ``torch`` | ``auto``);
3. ``auto``: CUDA tensors -> the Triton kernels, any other device -> the torch
   references of :mod:`triton_kernels.reference`.

Forcing ``triton`` on CPU tensors works only when the kernels were built by the
Triton interpreter, i.e. ``TRITON_INTERPRET=1`` was set before ``triton_kernels``
was first imported; otherwise :func:`require_runnable` raises a ``RuntimeError``
saying so (a compiled kernel cannot read host memory).

Value checks that need the tensors' contents (segment slot in range, lengths
in range) cost one device-to-host sync per call on CUDA. Set
``PREFILLING_DLLM_CHECK_VALUES=0`` to skip them in a hot loop or under CUDA
graph capture, once the caller's tables are known to be valid.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
import triton
import triton.language as tl

BACKENDS = ("triton", "torch")
LOG2E = 1.4426950408889634  # log2(e): kernels work in base 2 (exp2), LSE leaves in natural log
LN2 = 0.6931471805599453
# Jitted code may only read module globals that are constexpr.
LOG2E_C = tl.constexpr(LOG2E)
LN2_C = tl.constexpr(LN2)

_POISON = False


def resolve_backend(backend: str | None, device: torch.device) -> str:
    """Return ``"triton"`` or ``"torch"`` for a call whose tensors live on ``device``."""
    choice = backend if backend is not None else os.environ.get("PREFILLING_DLLM_BACKEND", "auto")
    choice = str(choice).strip().lower() or "auto"
    if choice == "auto":
        return "triton" if device.type == "cuda" else "torch"
    if choice not in BACKENDS:
        raise ValueError(
            f"backend must be 'triton', 'torch' or None (auto); got {choice!r} "
            "(from the backend= keyword or PREFILLING_DLLM_BACKEND)"
        )
    return choice


def is_interpreted(kernel) -> bool:
    """True when ``kernel`` was built by the Triton interpreter (TRITON_INTERPRET=1 at import)."""
    return type(kernel).__name__ == "InterpretedFunction"


def require_runnable(kernel, device: torch.device, op: str) -> None:
    """Raise a clear error when a Triton kernel cannot run on ``device``."""
    if device.type == "cuda" or is_interpreted(kernel):
        return
    raise RuntimeError(
        f"{op}: backend 'triton' was requested for {device.type} tensors, but the Triton kernels were "
        "compiled for a GPU. Set TRITON_INTERPRET=1 before importing triton_kernels to run them on CPU "
        "through the Triton interpreter (slow; for tests), or use backend='torch'."
    )


_SKIP_VALUE_CHECKS = False


def check_values_enabled() -> bool:
    """Data-dependent input checks (one host sync on CUDA) unless PREFILLING_DLLM_CHECK_VALUES=0
    or inside :func:`skip_value_checks`."""
    if _SKIP_VALUE_CHECKS:
        return False
    return os.environ.get("PREFILLING_DLLM_CHECK_VALUES", "1").strip() not in ("0", "false", "no")


@contextlib.contextmanager
def skip_value_checks():
    """Skip the data-dependent checks (slot/length ranges) of the ops inside this block.

    For hot loops whose index tensors were validated once (a decode loop over a static
    KV cache): the checks cost one host sync per call on CUDA. Shape/dtype/device checks
    still run.
    """
    global _SKIP_VALUE_CHECKS
    old = _SKIP_VALUE_CHECKS
    _SKIP_VALUE_CHECKS = True
    try:
        yield
    finally:
        _SKIP_VALUE_CHECKS = old


@contextlib.contextmanager
def poison_outputs(enabled: bool = True):
    """Test hook: every buffer a launcher allocates is filled with NaN (floats) or -7 (ints).

    Kernels must write every element they own, so a slot left unwritten shows up
    as NaN in the result instead of passing by luck with zero-initialised memory.
    """
    global _POISON
    old = _POISON
    _POISON = enabled
    try:
        yield
    finally:
        _POISON = old


def alloc(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.empty`` for launcher outputs, or a poisoned tensor inside :func:`poison_outputs`."""
    if not _POISON:
        return torch.empty(shape, dtype=dtype, device=device)
    fill = float("nan") if dtype.is_floating_point else -7
    return torch.full(shape, fill, dtype=dtype, device=device)


def next_pow2(x: int) -> int:
    return 1 if x <= 1 else triton.next_power_of_2(int(x))


def compute_dtype(kernel, dtype: torch.dtype):
    """Triton dtype the tiles are computed in.

    The native dtype on GPU (fp16/bf16 tensor cores, fp32 with IEEE dot). The
    interpreter stores bf16 as raw uint16 and cannot do arithmetic on it, so
    there bf16 tiles are upcast to fp32 right after the load.
    """
    if dtype == torch.bfloat16:
        return tl.float32 if is_interpreted(kernel) else tl.bfloat16
    return {torch.float16: tl.float16, torch.float32: tl.float32}[dtype]


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (used to size split-K grids); 8 elsewhere."""
    if device.type != "cuda":
        return 8
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())
