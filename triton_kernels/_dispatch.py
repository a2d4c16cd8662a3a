"""Backend choice, output allocation and launch helpers shared by the ops.

Dispatch rule, in order of precedence (CUDA runs the kernels, CPU a torch path):

1. the ``backend=`` keyword of a public op (``"triton"``, ``"torch"`` or ``None``);
2. the environment variable ``PREFILLING_DLLM_BACKEND`` (``triton`` | ``torch`` | ``auto``);
3. ``auto``: CUDA tensors -> the Triton kernels, any other device -> ``torch``: the
   references of :mod:`triton_kernels.reference`, except ``split_s_attention`` on CPU,
   which runs torch's fused CPU attention per row (:mod:`triton_kernels.split_s_cpu`).

Forcing ``triton`` on CPU tensors works only when the kernels were built by the
Triton interpreter, i.e. ``TRITON_INTERPRET=1`` was set before ``triton_kernels``
was first imported; otherwise :func:`require_runnable` raises a ``RuntimeError``
saying so (a compiled kernel cannot read host memory).

Value checks that need the tensors' contents (segment slot in range, lengths
in range) cost one device-to-host sync per call on CUDA. A caller that owns a
KV cache validates its tables once (:func:`triton_kernels.check_segment_table`)
and then calls the ops inside :func:`skip_value_checks` (or sets
``PREFILLING_DLLM_CHECK_VALUES=0``), e.g. in a decode loop or under CUDA graph
capture. Shape/dtype/device checks read only metadata and always run.

In eager mode the public ops call their implementation directly; under
``torch.compile`` (or any tracing dispatch mode, or tensor subclasses such as
FakeTensor) they go through the registered ``torch.library`` op
(:func:`call_op`). The dispatcher round trip costs about 20 us a call on CPU.
"""

from __future__ import annotations

import contextlib
import os

import torch
import triton.language as tl

BACKENDS = ("triton", "torch")

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


def compute_dtype(kernel, dtype: torch.dtype):
    """Triton dtype the tiles are computed in.

    The native dtype on GPU (fp16/bf16 tensor cores, fp32 with IEEE dot). The
    interpreter stores bf16 as raw uint16 and cannot do arithmetic on it, so
    there bf16 tiles are upcast to fp32 right after the load.
    """
    if dtype == torch.bfloat16:
        return tl.float32 if is_interpreted(kernel) else tl.bfloat16
    return {torch.float16: tl.float16, torch.float32: tl.float32}[dtype]


def call_op(op, impl, *args):
    """Run a public op: ``impl(*args)`` in plain eager mode, the registered ``op`` otherwise.

    The registered op is what ``torch.compile``, ``torch.export`` and FakeTensor tracing
    see; in eager mode with plain tensors it adds only dispatcher overhead, so it is skipped.
    """
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0:
        return op(*args)
    for a in args:
        if isinstance(a, torch.Tensor) and type(a) is not torch.Tensor:
            return op(*args)
    return impl(*args)
