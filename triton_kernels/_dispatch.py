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

Value checks that need the tensors' contents (segment slot in range, lengths in range,
no NaN score) follow one policy:

* CUDA, by default: **no host read** (no device-to-host sync in any op). The kernels guard
  every index they load: a slot outside ``[-1, P)`` or a length outside its range reads
  nothing, the affected output rows become NaN (never plausible numbers), and a bit is
  OR-ed into a per-device error word that :func:`triton_kernels.check_errors` reads
  lazily and raises from (``topb_gather``: a chunk with a bad length or a NaN score keeps
  nothing, idx -1 and kept 0, and its K/V rows are NaN). Also safe under CUDA graph capture.
* Checked mode, ``PREFILLING_DLLM_CHECK_VALUES=1`` or inside :func:`eager_value_checks`:
  every op reads the values on the host first and raises a ValueError at the bad call
  (one sync per call on CUDA).
* Other devices (CPU, the interpreter): the host checks run by default (no sync to
  save); the kernels' guards still back them up.
* ``PREFILLING_DLLM_CHECK_VALUES=0`` or :func:`skip_value_checks`: no host checks on
  any device (a caller that validated its tables once with
  :func:`triton_kernels.check_segment_table`).

Shape/dtype/device checks read only metadata and always run.

Host time: every kernel is launched through :func:`triton_kernels._launch.launch` (compiled
kernels cached per specialisation and called directly, ``kernel[grid]`` only on a miss or
where that path is not verified), plans are memoised (:mod:`triton_kernels.plan`), the
metadata checks are memoised per metadata signature (:func:`triton_kernels._validate.signature`),
and an op allocates only its outputs (plus split-S's partial buffers when its plan merges).
In eager mode an op whose signature was seen before runs a *prepared call* stored beside it
(output shapes, :class:`triton_kernels._launch.PreparedLaunch` records holding the grid and the
non-pointer arguments): the call allocates its outputs, reads its pointers and launches. The
environment variables above are read on every call, through :func:`triton_kernels._env.env` (a dict lookup on
POSIX, not ``os.environ``'s encode/decode), so setting one at run time still takes effect.

In eager mode the public ops call their implementation directly; under
``torch.compile`` (or any tracing dispatch mode, or tensor subclasses such as
FakeTensor) they go through the registered ``torch.library`` op
(:func:`call_op`). The dispatcher round trip costs about 20 us a call on CPU.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import triton.language as tl

from triton_kernels import _launch
from triton_kernels._env import env

BACKENDS = ("triton", "torch")

_POISON = False


def resolve_backend(backend: str | None, device: torch.device) -> str:
    """Return ``"triton"`` or ``"torch"`` for a call whose tensors live on ``device``."""
    choice = backend if backend is not None else env("PREFILLING_DLLM_BACKEND", "auto")
    if choice == "triton" or choice == "torch":  # the common spellings, without string work
        return choice
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
    """Raise a clear error when a Triton kernel cannot run on ``device`` (never inside
    :func:`triton_kernels._launch.stub_launches`, where nothing runs)."""
    if device.type == "cuda" or is_interpreted(kernel) or _launch._STUB is not None:
        return
    raise RuntimeError(
        f"{op}: backend 'triton' was requested for {device.type} tensors, but the Triton kernels were "
        "compiled for a GPU. Set TRITON_INTERPRET=1 before importing triton_kernels to run them on CPU "
        "through the Triton interpreter (slow; for tests), or use backend='torch'."
    )


_SKIP_VALUE_CHECKS = False
_FORCE_VALUE_CHECKS = False


def check_values_enabled(device: torch.device | None = None) -> bool:
    """Whether an op reads its index tensors' values on the host before it runs (see the module docstring).

    ``device``: the call's device. CUDA: no (the kernels guard and flag instead), unless
    ``PREFILLING_DLLM_CHECK_VALUES=1`` or inside :func:`eager_value_checks`; any other device
    (or None, for callers that predate the device rule): yes. ``PREFILLING_DLLM_CHECK_VALUES=0``
    and :func:`skip_value_checks` turn the host checks off everywhere.
    """
    return values_checked(None if device is None else device.type)


def values_checked(device_type: str | None) -> bool:
    """:func:`check_values_enabled` for a device type (``"cuda"``, ``"cpu"``, or None)."""
    if _SKIP_VALUE_CHECKS:
        return False
    if _FORCE_VALUE_CHECKS:
        return True
    mode = env("PREFILLING_DLLM_CHECK_VALUES", "auto")
    if mode != "auto":
        mode = mode.strip().lower()
        if mode in ("0", "false", "no"):
            return False
        if mode in ("1", "true", "yes"):
            return True
        if mode not in ("auto", ""):  # "on", "2", a typo: never silently the default
            raise ValueError(f"PREFILLING_DLLM_CHECK_VALUES must be 1/true/yes, 0/false/no or auto, got {mode!r}")
    return device_type is None or device_type not in _SYNC_FREE_TYPES


_SYNC_FREE_TYPES = ("cuda",)  # device types whose ops read no value on the host by default


@contextlib.contextmanager
def cuda_check_policy_on(device_type: str):
    """Test/benchmark hook: ``device_type`` tensors (e.g. ``"cpu"``) get CUDA's value-check policy
    (no host read by default), so the CUDA branch's Python path can be audited without a GPU."""
    global _SYNC_FREE_TYPES
    old = _SYNC_FREE_TYPES
    _SYNC_FREE_TYPES = (*old, device_type)
    try:
        yield
    finally:
        _SYNC_FREE_TYPES = old


@contextlib.contextmanager
def skip_value_checks():
    """Skip the host-side value checks (slot/length ranges) of the ops inside this block.

    For hot loops whose index tensors were validated once (:func:`triton_kernels.check_segment_table`)
    on a device where the checks are on by default (CPU), or under ``PREFILLING_DLLM_CHECK_VALUES=1``.
    Shape/dtype/device checks and the kernels' own bounds guards still run.
    """
    global _SKIP_VALUE_CHECKS
    old = _SKIP_VALUE_CHECKS
    _SKIP_VALUE_CHECKS = True
    try:
        yield
    finally:
        _SKIP_VALUE_CHECKS = old


@contextlib.contextmanager
def eager_value_checks():
    """Checked mode: every op inside this block reads its index tensors' values on the host (one
    device-to-host sync per call on CUDA) and raises a ValueError at the call that holds a bad one.

    For debugging a caller whose :func:`check_errors` reported a bad index. An enclosing or nested
    :func:`skip_value_checks` wins.
    """
    global _FORCE_VALUE_CHECKS
    old = _FORCE_VALUE_CHECKS
    _FORCE_VALUE_CHECKS = True
    try:
        yield
    finally:
        _FORCE_VALUE_CHECKS = old


# Bits of the device error word, and what each means.
ERR_SEG_SLOT, ERR_SEG_LEN, ERR_LIVE_LEN, ERR_CHUNK_LEN, ERR_TOPB = 1, 2, 4, 8, 16
ERROR_MEANINGS = {
    ERR_SEG_SLOT: "split_s_attention: a seg_slots entry outside [-1, P)",
    ERR_SEG_LEN: "split_s_attention: a seg_lens entry outside [0, T]",
    ERR_LIVE_LEN: "split_s_attention: a live_lens entry outside [0, M]",
    ERR_CHUNK_LEN: "chunk_attention_scores / chunk_row_mass: a lens entry outside [0, T]",
    ERR_TOPB: "topb_gather: a lens entry outside [0, T] or a NaN score among the valid tokens",
}
_ERROR_WORDS: dict[torch.device, torch.Tensor] = {}


def error_word(device: torch.device) -> torch.Tensor:
    """The ``[1]`` int32 error word of ``device`` that kernels OR their bad-index bits into.

    Allocated (zeroed) at the first launch on that device, then reused: no allocation per call.
    Make that first launch before capturing a CUDA graph (a warm-up call does).
    """
    word = _ERROR_WORDS.get(device)
    if word is None:
        word = _ERROR_WORDS[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return word


def check_errors(device: torch.device | str | None = None) -> None:
    """Raise if an op met a bad index since the last call, and clear the record.

    The ops do not read index tensors on the host by default on CUDA (no sync per call); their
    kernels read nothing out of bounds, make the affected output rows NaN and OR a bit into a
    per-device error word. This reads that word (one device-to-host sync per device that ran a
    kernel), e.g. once per denoising step or at the end of a generation.

    Args:
        device: only this device's word (``"cuda"`` without an index: the current CUDA device, as torch
            reads it); None: every device that ran a kernel.

    Raises:
        ValueError: naming each kind of bad index seen (op, tensor, allowed range). Rerun the
            call inside :func:`eager_value_checks` to have the call that holds it raise.
    """
    want = None if device is None else _indexed(torch.device(device))
    for dev, word in list(_ERROR_WORDS.items()):
        if want is not None and dev != want:
            continue
        bits = int(word.item())
        if bits:
            word.zero_()
            seen = "; ".join(msg for bit, msg in ERROR_MEANINGS.items() if bits & bit)
            raise ValueError(
                f"a kernel on {dev} met a bad index since the last check_errors() ({seen}); it read nothing "
                "out of bounds and made the affected output rows NaN. Run the calls inside "
                "triton_kernels.eager_value_checks() to find the one."
            )


def _indexed(device: torch.device) -> torch.device:
    """``device`` with its index: an unindexed accelerator (``cuda``) means the current one (0 where none is
    available), the key the error words are stored under."""
    if device.type == "cpu" or device.index is not None:
        return device
    backend = getattr(torch, device.type, None)
    current = backend.current_device() if backend is not None and backend.is_available() else 0
    return torch.device(device.type, current)


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


def alloc_spec(spec: tuple) -> torch.Tensor:
    """An output of a prepared call: ``spec = (shape, strides, dtype, device)`` (contiguous strides),
    ``torch.empty_strided`` (cheaper than ``torch.empty`` on the host), or :func:`alloc` inside
    :func:`poison_outputs`."""
    if not _POISON:
        return torch.empty_strided(spec[0], spec[1], dtype=spec[2], device=spec[3])
    return alloc(spec[0], spec[2], spec[3])


def out_spec(shape: tuple, dtype: torch.dtype, device: torch.device) -> tuple:
    """The :func:`alloc_spec` of a contiguous ``shape`` tensor."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(shape), tuple(reversed(strides)), dtype, device


def eager() -> bool:
    """True in plain eager mode: no ``torch.compile`` tracing and no dispatch mode active, so an op may
    run its prepared call instead of the registered op (:func:`call_op`)."""
    return not torch.compiler.is_compiling() and torch._C._len_torch_dispatch_stack() == 0


def compute_dtype(kernel, dtype: torch.dtype):
    """Triton dtype the tiles are computed in.

    The native dtype on GPU (fp16/bf16 tensor cores, fp32 with IEEE dot). The
    interpreter stores bf16 as raw uint16 and cannot do arithmetic on it, so
    there bf16 tiles are upcast to fp32 right after the load.
    """
    if dtype == torch.bfloat16:
        return tl.float32 if is_interpreted(kernel) else tl.bfloat16
    return {torch.float16: tl.float16, torch.float32: tl.float32}[dtype]


def dot_tiles(kernel, dtype: torch.dtype, block_m: int, block_n: int, block_d: int) -> tuple:
    """The constexprs the signature of a ``tl.dot`` kernel ends with: ``(BLOCK_M, BLOCK_N, BLOCK_D,
    COMPUTE, DOT_PREC)``: the tile, its :func:`compute_dtype` and the dot's input precision (``"ieee"`` for
    fp32 tiles, else ``"tf32"``, which fp16/bf16 tiles ignore)."""
    comp = compute_dtype(kernel, dtype)
    return block_m, block_n, block_d, comp, "ieee" if comp == tl.float32 else "tf32"


def register_op(name: str, impl, check, fake, schema: str | None = None):
    """Register ``impl(*args, backend)`` as the custom op ``prefilling_dllm::<name>``; returns ``(entry, op)``.

    ``entry``, the op's body, runs ``check(*args)`` (the metadata checks, every argument but the last,
    ``backend``) before ``impl``: a direct ``torch.ops`` call (e.g. opcheck) skips the public function's
    checks, so a tensor on the wrong device is still named before any value is read. ``fake`` is the op's
    fake (meta) implementation; the schema is inferred from ``impl``'s annotations unless given.
    """

    @functools.wraps(impl)
    def entry(*args):  # the dispatcher passes every argument positionally
        check(*args[:-1])
        return impl(*args)

    op = torch.library.custom_op(f"prefilling_dllm::{name}", entry, mutates_args=(), schema=schema)
    op.register_fake(fake)
    return entry, op


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
