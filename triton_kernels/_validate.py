"""Input validation shared by the public ops.

Shape, dtype, device and layout checks read only metadata, so they also run on
FakeTensors while ``torch.compile`` traces a caller. Checks that read tensor
*values* (slot in range, lengths in range) live in ``check_*_values`` and run
inside the registered ops, where the data is real (see
:func:`triton_kernels._dispatch.check_values_enabled`).

Every error names the op, the argument and what was expected.
"""

from __future__ import annotations

import math
import numbers

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256
SUPPORTED_HEAD_DIMS = "any multiple of 16 from 16 to 256"


def check_tensors(op: str, **tensors) -> None:
    """Every named argument is a torch.Tensor (a TypeError names the first one that is not)."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")


def check_ndim(op: str, name: str, t: torch.Tensor, ndim: int, layout: str) -> None:
    check_tensors(op, **{name: t})
    if t.dim() != ndim:
        raise ValueError(f"{op}: {name} must be {ndim}-D {layout}, got shape {tuple(t.shape)}")


def _check_float_dtype(op: str, name: str, t: torch.Tensor) -> None:
    """check_float's per-tensor check, run inside :func:`_shared`'s loop to keep the error order."""
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {name} has dtype {t.dtype}; supported: float32, float16, bfloat16")


def _shared(op: str, tensors: dict, attr: str, verb: str, exc: type, each=None):
    """The ``attr`` all non-None tensors share (None if none): one loop for check_float and check_device."""
    value = first = None
    for name, t in tensors.items():
        if t is None:
            continue
        if each is not None:
            each(op, name, t)
        if first is None:
            value, first = getattr(t, attr), name
        elif getattr(t, attr) != value:
            raise exc(f"{op}: {attr} mismatch: {first} {verb} {value} but {name} {verb} {getattr(t, attr)}")
    return value


def check_float(op: str, **tensors: torch.Tensor) -> torch.dtype:
    """All named tensors share one floating dtype among fp32/fp16/bf16; returns it (None when all are None).

    Raises:
        TypeError: a dtype outside fp32/fp16/bf16, or two tensors of different dtypes.
    """
    return _shared(op, tensors, "dtype", "is", TypeError, each=_check_float_dtype)


def check_device(op: str, **tensors: torch.Tensor) -> torch.device:
    """All named tensors live on one device; returns it (None when all are None).

    Raises:
        ValueError: two tensors on different devices.
    """
    return _shared(op, tensors, "device", "is on", ValueError)


def check_last_dim_contiguous(op: str, **tensors: torch.Tensor) -> None:
    """Kernels stride over every dim but the last (head_dim), which must have stride 1."""
    for name, t in tensors.items():
        if t is None or t.numel() == 0:
            continue
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise ValueError(
                f"{op}: {name} must be contiguous in its last dim (stride 1), "
                f"got strides {tuple(t.stride())}; other dims may have any stride. Call .contiguous() on it."
            )


def check_head_dim_positive(op: str, d: int) -> None:
    """Every backend needs D >= 1 (the default scale is 1/sqrt(D))."""
    if d < 1:
        raise ValueError(f"{op}: head_dim D must be >= 1, got D={d} (the last dim of q and k)")


def as_int(op: str, name: str, value) -> int:
    """``value`` as a Python int: an int, a numpy integer or a 0-d integer torch tensor (read on the host).

    Raises:
        TypeError: a bool (numpy/torch bools too), a float, or anything else that is not an integer.
    """
    if isinstance(value, torch.Tensor):
        if value.dim() == 0 and not value.dtype.is_floating_point and not value.dtype.is_complex:
            if value.dtype != torch.bool:
                return int(value)
    elif not isinstance(value, bool) and isinstance(value, numbers.Integral):
        return int(value)
    raise TypeError(f"{op}: {name} must be an int, got {type(value).__name__} {value!r}")


def check_head_dim(op: str, d: int) -> None:
    if d % 16 != 0 or not (MIN_HEAD_DIM <= d <= MAX_HEAD_DIM):
        raise ValueError(f"{op}: head_dim D={d} is not supported; supported: {SUPPORTED_HEAD_DIMS}")


def check_gqa(op: str, hq: int, hkv: int) -> int:
    if hkv < 1 or hq < 1 or hq % hkv != 0:
        raise ValueError(
            f"{op}: query heads Hq={hq} must be a positive multiple of KV heads Hkv={hkv} (GQA, Hq = G * Hkv)"
        )
    return hq // hkv


def check_shape(op: str, name: str, t: torch.Tensor, expected: tuple, what: str) -> None:
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{op}: {name} must have shape {what} = {tuple(expected)}, got {tuple(t.shape)}")


def check_index_tensor(op: str, name: str, t: torch.Tensor, shape: tuple, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be an integer torch.Tensor, got {type(t).__name__}")
    if t.dtype not in INDEX_DTYPES:
        raise TypeError(f"{op}: {name} must be int32 or int64, got {t.dtype}")
    check_shape(op, name, t, shape, what)


def check_scale(op: str, sm_scale) -> None:
    """sm_scale is None or a finite real number (a NaN/inf scale would make every logit non-finite)."""
    if sm_scale is None:
        return
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)):
        raise TypeError(f"{op}: sm_scale must be a float or None, got {type(sm_scale).__name__}")
    try:
        finite = math.isfinite(sm_scale)
    except OverflowError:  # an int beyond the float range
        finite = False
    if not finite:
        raise ValueError(f"{op}: sm_scale must be finite, got {sm_scale}")


# ----------------------------------------------------------------------------- value checks


def _flags(*conds: torch.Tensor) -> list[bool]:
    """Evaluate several boolean reductions with a single host sync."""
    if not conds:
        return []
    return [bool(x) for x in torch.stack([c.reshape(()) for c in conds]).tolist()]


def check_segment_table_values(
    op: str,
    seg_slots: torch.Tensor,
    seg_lens: torch.Tensor,
    p: int,
    t: int,
    live_lens: torch.Tensor | None = None,
    m: int = 0,
) -> None:
    """seg_slots in [-1, P), seg_lens in [0, T] and live_lens in [0, M], with one host sync.

    The tables' devices are compared first, so a table on another device is named (ValueError)
    instead of failing inside the reduction below.
    """
    check_device(op, seg_slots=seg_slots, seg_lens=seg_lens, live_lens=live_lens)
    conds = []
    if seg_slots.numel():
        conds += [(seg_slots < -1).any(), (seg_slots >= p).any(), (seg_lens < 0).any(), (seg_lens > t).any()]
    if live_lens is not None and live_lens.numel():
        conds += [(live_lens < 0).any() | (live_lens > m).any()]
    flags = _flags(*conds)
    if seg_slots.numel():
        slot_lo, slot_hi, len_lo, len_hi = flags[:4]
        if slot_lo or slot_hi:
            raise ValueError(
                f"{op}: seg_slots out of range: every entry must be -1 (no segment) or a slot in [0, P={p}); "
                f"got min {int(seg_slots.min())}, max {int(seg_slots.max())}"
            )
        if len_lo or len_hi:
            raise ValueError(
                f"{op}: seg_lens out of range: every entry must be in [0, T={t}]; "
                f"got min {int(seg_lens.min())}, max {int(seg_lens.max())}"
            )
    if live_lens is not None and live_lens.numel() and flags[-1]:
        raise ValueError(
            f"{op}: live_lens out of range: every entry must be in [0, M={m}] (M = q.shape[1]); "
            f"got min {int(live_lens.min())}, max {int(live_lens.max())}"
        )


def check_lens_values(op: str, lens: torch.Tensor | None, t: int) -> None:
    """Per-chunk valid lengths in [0, T]."""
    if lens is None or lens.numel() == 0:
        return
    lo, hi = _flags((lens < 0).any(), (lens > t).any())
    if lo or hi:
        raise ValueError(
            f"{op}: lens out of range: every entry must be in [0, T={t}]; "
            f"got min {int(lens.min())}, max {int(lens.max())}"
        )


def check_scores_values(op: str, scores: torch.Tensor, lens: torch.Tensor | None) -> None:
    """lens in [0, T] and no NaN among the valid tokens' scores (NaN has no rank), with one host sync."""
    check_device(op, scores=scores, lens=lens)
    t = scores.shape[-1]
    valid = None if lens is None else torch.arange(t, device=scores.device)[None, :] < lens[:, None]  # [N, T]
    nan = torch.isnan(scores)  # [N, Hkv, T]
    if valid is not None:
        nan = nan & valid[:, None, :]
    conds = [nan.any()] + ([] if lens is None else [(lens < 0).any(), (lens > t).any()])
    flags = _flags(*conds)
    if lens is not None and (flags[1] or flags[2]):
        raise ValueError(
            f"{op}: lens out of range: every entry must be in [0, T={t}]; "
            f"got min {int(lens.min())}, max {int(lens.max())}"
        )
    if flags[0]:
        n, h, tok = (int(x) for x in nan.nonzero()[0])
        raise ValueError(
            f"{op}: scores hold NaN at {int(nan.sum())} valid token(s) (first: chunk {n}, KV head {h}, "
            f"token {tok}); NaN has no rank. Fix the scores' source or clean them (torch.nan_to_num)."
        )


# ----------------------------------------------------------------------------- layout


def with_layout(err: ValueError, layout: str, hint: str = "") -> ValueError:
    """``err`` with the op's expected layout appended (and a hint when a tensor looks transposed).

    Engineers come from ``scaled_dot_product_attention``, whose tensors are ``[B, H, M, D]``;
    the ops here are token-major (``[B, M, H, D]``, the KV cache's layout), so every shape
    error says which layout it expected.
    """
    sep = "; " if hint else ""  # one f-string: dynamo cannot trace str += str, and lost the message
    return ValueError(f"{err}. Expected layout: {layout}{sep}{hint}")


SDPA_NOTE = "tensors in SDPA's [B, H, M, D] layout must be transposed first (x.transpose(1, 2))"


# ----------------------------------------------------------------------------- memo

_PASSED: dict = {}  # metadata signature of a call whose metadata checks passed -> its prepared call, or True
_MAX_PASSED = 4096


def check_no_grad(op: str, tensors: tuple) -> None:
    """Refuse an input that requires grad while autograd records: the ops have no backward formula
    (inference kernels), so an output would silently cut the graph on one path and raise on another.

    Raises:
        RuntimeError: naming the op; the fix is ``torch.no_grad()`` / ``torch.inference_mode()`` or
            ``.detach()``.
    """
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.requires_grad:
            raise RuntimeError(
                f"{op}: an input requires grad, but the triton_kernels ops are inference-only (no backward "
                "formula on any backend); call them under torch.no_grad() or torch.inference_mode(), or pass "
                "detached tensors"
            )


def signature(op: str, tensors: tuple, extra: tuple):
    """Key of everything the metadata checks of ``op`` read (each tensor's shape, dtype, device and
    strides, plus ``extra`` scalars), or None when one is not a plain ``torch.Tensor`` (then the
    checks run in full: FakeTensors under tracing, wrong types that must raise). Every op calls it
    first, so it also applies :func:`check_no_grad`.

    Also None while ``torch.compile`` traces the caller: the memo is an eager fast path, and a traced read
    of it would make dynamo wrap the whole process-wide dict, whose keys may hold numpy scalars from earlier
    eager calls (``topb_gather(..., b=np.int64(4))``), which dynamo cannot hash: every later compile of any
    op failed with "unhashable type: 'numpy.ndarray'". A traced read also guarded the compiled graph on
    the memo's contents, so any eager call with new shapes recompiled it.

    Raises:
        RuntimeError: from :func:`check_no_grad`.
    """
    if torch.is_grad_enabled():
        check_no_grad(op, tensors)
    if torch.compiler.is_compiling():
        return None
    sig = [op, extra]
    for t in tensors:
        if t is None:
            sig.append(None)
        elif type(t) is torch.Tensor:
            sig.append((t.shape, t.dtype, t.device, t.stride()))
        else:
            return None
    return tuple(sig)


def passed(sig) -> bool:
    """True when a call with this metadata signature already passed its op's checks (a decode loop
    then pays only for the key, not for the checks)."""
    try:
        return sig is not None and sig in _PASSED
    except TypeError:  # an unhashable scalar (e.g. a list for sm_scale): the checks will say what is wrong
        return False


def recall(sig):
    """What :func:`remember` stored for ``sig`` (an op's prepared call, or True), None when unseen."""
    try:
        return None if sig is None else _PASSED.get(sig)
    except TypeError:  # an unhashable scalar: the checks will say what is wrong
        return None


def remember(sig, prepared=True) -> None:
    """Record that ``sig`` passed, with the op's prepared call for it (or True: none) (bounded: the
    memo is cleared at 4096 signatures). The prepared call must depend only on what ``sig`` holds."""
    if sig is None:
        return
    if len(_PASSED) >= _MAX_PASSED:
        _PASSED.clear()
    _PASSED[sig] = True if prepared is None else prepared
