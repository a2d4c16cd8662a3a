"""Intra-chunk token scores: the attention mass exchanged between chunk tokens and scoring tokens.

Prefilling-dLLM ranks the tokens inside each kept chunk by the attention mass
they exchange with the scoring tokens (query window / pseudo-labels), then keeps
the top-B (:mod:`triton_kernels.topb`). Two directions, one file:

* :func:`chunk_attention_scores` (scoring tokens -> chunk keys): the softmax mass
  each chunk key receives from the ``M`` scoring queries attending over
  (valid chunk keys + extra keys), summed over the queries and the ``G`` query
  heads of its KV group. Two passes so that no ``[M, T]`` probability matrix per
  head ever reaches global memory: pass 1 (``_row_lse_kernel``) computes every
  query row's LSE over all its keys with an online max/sum (split over the keys
  when there are few chunks, :func:`triton_kernels.plan.plan_chunk_scores`);
  pass 2 (``_column_mass_kernel``) combines the split LSEs, recomputes ``Q K^T``
  one key tile at a time and sums ``exp(s - lse_row)`` down the columns.
* :func:`chunk_row_mass` (chunk tokens -> scoring tokens): for every chunk row,
  the mass it sends to the extra keys when attending over (valid chunk keys +
  extra keys) = ``exp(lse_extra - lse_all)``, summed over the G heads
  (``_row_mass_kernel``, one pass, two LSEs per row).

GQA packing as in :mod:`triton_kernels.split_s`: the G query heads of a KV head
are rows of the same tile (row ``r`` = token ``r // G``, head ``h * G + r % G``).

The three kernels live in :mod:`triton_kernels.chunk_scores_kernels`; this module plans and
launches them (prepared calls, as the other ops) and holds the two public ops.

Sources: Prefilling-dLLM (arXiv 2606.10537) intra-chunk token selection;
FlashAttention-2 online softmax (base 2, scale folded into ``sm_scale*log2(e)``);
the recompute-the-scores-from-the-LSE trick of FlashAttention's backward pass.
"""

from __future__ import annotations

import math

import torch

from triton_kernels import _dispatch, _launch
from triton_kernels import _validate as V
from triton_kernels import plan as _plan
from triton_kernels import reference as _ref
from triton_kernels._constants import LOG2E
from triton_kernels._dispatch import ERR_CHUNK_LEN, call_op, require_runnable  # per module: tests patch these
from triton_kernels._launch import PreparedLaunch
from triton_kernels.chunk_scores_kernels import _column_mass_kernel, _row_lse_kernel, _row_mass_kernel
from triton_kernels.plan import attention_tiles, cdiv, gpu_spec, plan_chunk_scores

# ----------------------------------------------------------------------------- launchers


class _ScoresCall:
    """A prepared ``chunk_attention_scores`` call (:func:`_prepare_scores`): output specs, the row-LSE
    launch and one column launch per key set (chunk keys, extra keys); a call supplies the pointers."""

    __slots__ = (
        "mass", "extra_mass", "lse", "lse_part", "row_lse", "columns", "native", "err", "device_type", "kernels",
    )  # fmt: skip


def _prepare_scores(q, k, lens, k_extra, sm_scale, block_m=None, block_n=None):
    """The :class:`_ScoresCall` of these inputs' metadata, or None when no kernel runs (N = 0 or M = 0)."""
    n, m, hq, d = q.shape
    t, hkv = k.shape[1], k.shape[2]
    e = 0 if k_extra is None else k_extra.shape[1]
    if n == 0 or m == 0:
        return None
    plan = plan_chunk_scores(n, m, hq, hkv, d, t, q.element_size(), gpu_spec(q.device), block_m, block_n)
    split = plan.n_splits > 1
    if split and t == 0 and e == 0:  # pragma: no cover - a split needs chunk keys; kept for safety
        return None
    call = _ScoresCall()
    f32, dev = torch.float32, q.device
    call.mass = _dispatch.out_spec((n, hkv, t), f32, dev)
    call.extra_mass = _dispatch.out_spec((n, hkv, e), f32, dev)
    call.lse = _dispatch.out_spec((n, m, hq), f32, dev)
    # without a split, pass 1 writes the final LSEs: its partial buffer is lse itself ([1, N, M, Hq])
    call.lse_part = _dispatch.out_spec((plan.n_splits, n, m, hq), f32, dev) if split else None
    sp = call.lse_part[1] if split else (n * m * hq, *call.lse[1])
    x = k if k_extra is None else k_extra
    qk_scale = float(sm_scale) * LOG2E.value
    tiles = _dispatch.dot_tiles(_row_lse_kernel, q.dtype, plan.block_m, plan.block_n, plan.block_d)
    sq = q.stride()[:3]
    group = hq // hkv
    # each tail: the kernel's signature order after its 6 pointers (triton_kernels._launch.launch)
    strides = (*sq, *k.stride()[:3], *x.stride()[:3], *sp)
    tail = (m, t, e, plan.split_len, plan.n_splits, qk_scale, *strides, group, d, lens is not None, *tiles)
    call.row_lse = PreparedLaunch(_row_lse_kernel, plan.lse_grid, tail, plan.num_warps)
    call.columns = []  # (True: chunk keys and mass / False: extra keys and extra_mass, launch)
    write_lse = split  # with splits, the first column launch stores the combined LSEs
    for is_chunk, keys, n_keys, has_lens, out in (
        (True, k, t, lens is not None, call.mass),
        (False, k_extra, e, False, call.extra_mass),
    ):
        if n_keys == 0:
            continue
        strides = (*sq, *keys.stride()[:3], *sp, *call.lse[1], *out[1])
        tail = (m, n_keys, qk_scale, *strides, group, d, has_lens, plan.n_splits, write_lse, *tiles)
        grid = (cdiv(n_keys, plan.block_n), hkv, n)
        call.columns.append((is_chunk, PreparedLaunch(_column_mass_kernel, grid, tail, plan.num_warps)))
        write_lse = False
    call.device_type = dev.type
    call.native = call.device_type == "cuda"  # else require_runnable per call
    call.err = _dispatch.error_word(dev)
    call.kernels = (_row_lse_kernel, _column_mass_kernel)  # what the launches above hold
    return call


def _run_scores(call: _ScoresCall, q, k, lens, k_extra):
    if not call.native and _launch._STUB is None:
        require_runnable(_row_lse_kernel, q.device, "chunk_attention_scores")
    spec = _dispatch.alloc_spec
    mass, extra_mass, lse = spec(call.mass), spec(call.extra_mass), spec(call.lse)
    lse_part = lse if call.lse_part is None else spec(call.lse_part)
    x = k if k_extra is None else k_extra
    lens_arg = k if lens is None else lens  # a dummy pointer when HAS_LENS is False
    aligned = not (q.data_ptr() | k.data_ptr() | x.data_ptr() | lens_arg.data_ptr()) & 15
    call.row_lse((q, k, x, lens_arg, lse_part, call.err), aligned)
    for is_chunk, launch in call.columns:
        if is_chunk:
            launch((q, k, lens_arg, lse_part, lse, mass), aligned)
        else:
            launch((q, k_extra, lens_arg, lse_part, lse, extra_mass), aligned)
    return mass, extra_mass, lse


def chunk_attention_scores_launch(q, k, lens, k_extra, sm_scale, *, block_m=None, block_n=None):
    """Pass 1 (row LSEs, split over keys per the plan) then pass 2 (column sums) on validated inputs.

    Returns ``(mass [N, Hkv, T], extra_mass [N, Hkv, E], lse [N, M, Hq])``, all fp32.
    """
    require_runnable(_row_lse_kernel, q.device, "chunk_attention_scores")
    call = _prepare_scores(q, k, lens, k_extra, sm_scale, block_m, block_n)
    if call is not None:
        return _run_scores(call, q, k, lens, k_extra)
    mass, extra_mass, lse = (_dispatch.alloc(s, torch.float32, q.device) for s in _scores_shapes(q, k, k_extra))
    if q.shape[0] == 0:
        return mass, extra_mass, lse
    return mass.zero_(), extra_mass.zero_(), lse  # no scoring query: no mass anywhere


def _scores_shapes(q, k, k_extra) -> tuple:
    """``(mass, extra_mass, lse)`` shapes of ``chunk_attention_scores``: ``[N, Hkv, T]``, ``[N, Hkv, E]``,
    ``[N, M, Hq]``."""
    n, m, hq, _ = q.shape
    t, hkv = k.shape[1], k.shape[2]
    return (n, hkv, t), (n, hkv, 0 if k_extra is None else k_extra.shape[1]), (n, m, hq)


class _RowMassCall:
    """A prepared ``chunk_row_mass`` call (:func:`_prepare_row_mass`)."""

    __slots__ = ("out", "launch", "native", "err", "device_type", "kernels")


def _prepare_row_mass(q, k, lens, k_extra, sm_scale, block_m=None, block_n=None):
    """The :class:`_RowMassCall` of these inputs' metadata, or None when no kernel runs (an empty
    output, or no extra key: zeros)."""
    n, t, hq, d = q.shape
    hkv = k.shape[2]
    e = 0 if k_extra is None else k_extra.shape[1]
    if n * hkv * t == 0 or e == 0:
        return None
    block_m, block_n, block_d = attention_tiles(d, t, block_m, block_n)
    tiles = _dispatch.dot_tiles(_row_mass_kernel, q.dtype, block_m, block_n, block_d)
    call = _RowMassCall()
    call.out = _dispatch.out_spec((n, hkv, t), torch.float32, q.device)
    strides = (*q.stride()[:3], *k.stride()[:3], *k_extra.stride()[:3], *call.out[1])
    # the kernel's signature order after its 6 pointers (triton_kernels._launch.launch)
    tail = (t, e, float(sm_scale) * LOG2E.value, *strides, hq // hkv, d, lens is not None, *tiles)
    call.launch = PreparedLaunch(_row_mass_kernel, (cdiv(t, block_m), hkv, n), tail, 4)
    call.kernels = (_row_mass_kernel,)
    call.device_type = q.device.type
    call.native = call.device_type == "cuda"  # else require_runnable per call
    call.err = _dispatch.error_word(q.device)
    return call


def _run_row_mass(call: _RowMassCall, q, k, lens, k_extra):
    if not call.native and _launch._STUB is None:
        require_runnable(_row_mass_kernel, q.device, "chunk_row_mass")
    out = _dispatch.alloc_spec(call.out)
    lens_arg = k if lens is None else lens
    aligned = not (q.data_ptr() | k.data_ptr() | k_extra.data_ptr() | lens_arg.data_ptr()) & 15
    call.launch((q, k, k_extra, lens_arg, out, call.err), aligned)
    return out


def chunk_row_mass_launch(q, k, lens, k_extra, sm_scale, *, block_m=None, block_n=None):
    """One pass on validated inputs. Returns ``[N, Hkv, T]`` fp32."""
    require_runnable(_row_mass_kernel, q.device, "chunk_row_mass")
    call = _prepare_row_mass(q, k, lens, k_extra, sm_scale, block_m, block_n)
    if call is not None:
        return _run_row_mass(call, q, k, lens, k_extra)
    out = _dispatch.alloc((k.shape[0], k.shape[2], k.shape[1]), torch.float32, q.device)
    return out if out.numel() == 0 else out.zero_()  # no extra keys: no row sends them any mass


def _layout(q_tokens_are_chunk: bool) -> str:
    q = "q [N, T, Hq, D] (one query per chunk token)" if q_tokens_are_chunk else "q [N, M, Hq, D]"
    return f"{q}, k [N, T, Hkv, D], k_extra [N, E, Hkv, D] (token-major)"


def _validate(op, q, k, lens, k_extra, sm_scale, q_tokens_are_chunk: bool) -> None:
    try:
        _validate_shapes(op, q, k, lens, k_extra, q_tokens_are_chunk)
    except ValueError as err:
        raise V.with_layout(err, _layout(q_tokens_are_chunk), _sdpa_hint(q, k, k_extra, q_tokens_are_chunk)) from None
    V.check_device(op, q=q, k=k, k_extra=k_extra, lens=lens)
    V.check_last_dim_contiguous(op, q=q, k=k, k_extra=k_extra)
    V.check_scale(op, sm_scale)


def _sdpa_hint(q, k, k_extra, q_tokens_are_chunk: bool) -> str:
    """Name the tensor that looks like SDPA's [N, H, L, D] where the shapes tell (else the general note)."""
    if q.dim() == 4 and k.dim() == 4:
        if q_tokens_are_chunk and q.shape[2] == k.shape[1] and q.shape[1] != k.shape[1]:
            return f"q {tuple(q.shape)} looks like SDPA's [N, Hq, T, D]: pass q.transpose(1, 2)"
        if k_extra is not None and k_extra.dim() == 4 and k_extra.shape[1] == k.shape[2] != k_extra.shape[2]:
            return f"k_extra {tuple(k_extra.shape)} looks like SDPA's [N, Hkv, E, D]: pass k_extra.transpose(1, 2)"
    return V.SDPA_NOTE


def _validate_shapes(op, q, k, lens, k_extra, q_tokens_are_chunk: bool) -> None:
    V.check_ndim(op, "q", q, 4, "[N, T, Hq, D]" if q_tokens_are_chunk else "[N, M, Hq, D]")
    V.check_ndim(op, "k", k, 4, "[N, T, Hkv, D]")
    if k_extra is not None:
        V.check_ndim(op, "k_extra", k_extra, 4, "[N, E, Hkv, D]")
    V.check_float(op, q=q, k=k, k_extra=k_extra)
    n, mq, hq, d = q.shape
    nk, t, hkv, dk = k.shape
    if nk != n:
        raise ValueError(f"{op}: q has N={n} chunks but k has N={nk}")
    if dk != d:
        raise ValueError(f"{op}: head_dim mismatch: q has D={d} but k has D={dk}")
    V.check_head_dim_positive(op, d)
    if q_tokens_are_chunk and mq != t:
        raise ValueError(f"{op}: q must hold one query per chunk token: q has T={mq} (q.shape[1]), k has T={t}")
    V.check_gqa(op, hq, hkv)
    if k_extra is not None:
        ne, _, he, de = k_extra.shape
        if (ne, he, de) != (n, hkv, d):
            raise ValueError(f"{op}: k_extra must be [N={n}, E, Hkv={hkv}, D={d}], got shape {tuple(k_extra.shape)}")
    if lens is not None:
        V.check_index_tensor(op, "lens", lens, (n,), "[N]")


# ----------------------------------------------------------------------------- public ops
# The two ops share their signature (q, k, lens, k_extra, sm_scale, backend), their checks and
# their dispatch; they differ in the reference, the launcher and the output shapes.

_SIGNATURE = "(Tensor q, Tensor k, Tensor? lens, Tensor? k_extra, float sm_scale, str backend)"


def _register(name: str, returns: str, reference, launch, fake):
    """``(impl, op)`` for one scoring op: value checks, then the torch reference or the launcher."""

    def impl(q, k, lens, k_extra, sm_scale, backend):
        checked = _dispatch.check_values_enabled(q.device if backend == "triton" else None)
        if checked:  # the reference indexes by lens
            V.check_lens_values(name, lens, k.shape[1])
        if backend == "triton":
            return launch(q, k, lens, k_extra, sm_scale)
        if checked or lens is None or all(0 <= x <= k.shape[1] for x in lens.tolist()):  # the reference reads them
            return reference(q, k, lens, k_extra, sm_scale=sm_scale)
        # the kernels' guard, no host read: a chunk whose length is outside [0, T] reads nothing, its
        # outputs are NaN and the error word says why
        bad = (lens < 0) | (lens > k.shape[1])
        _dispatch.error_word(lens.device).bitwise_or_(bad.any().to(torch.int32) * ERR_CHUNK_LEN)
        out = reference(q, k, lens.masked_fill(bad, 0), k_extra, sm_scale=sm_scale)
        if isinstance(out, tuple):
            return tuple(o.masked_fill(bad.view(-1, *[1] * (o.dim() - 1)), float("nan")) for o in out)
        return out.masked_fill(bad.view(-1, 1, 1), float("nan"))

    def check(q, k, lens, k_extra, sm_scale):
        _validate(name, q, k, lens, k_extra, sm_scale, name == "chunk_row_mass")

    _, op = _dispatch.register_op(name, impl, check, fake, _SIGNATURE + returns)
    return impl, op


def _scores_fake(q, k, lens, k_extra, sm_scale, backend):
    return tuple(q.new_empty(shape, dtype=torch.float32) for shape in _scores_shapes(q, k, k_extra))


def _row_mass_fake(q, k, lens, k_extra, sm_scale, backend):
    return q.new_empty((k.shape[0], k.shape[2], k.shape[1]), dtype=torch.float32)


_scores_impl, _chunk_scores_op = _register(
    "chunk_attention_scores",
    " -> (Tensor, Tensor, Tensor)",
    _ref.chunk_attention_scores,
    chunk_attention_scores_launch,
    _scores_fake,
)
_row_mass_impl, _chunk_row_mass_op = _register(
    "chunk_row_mass", " -> Tensor", _ref.chunk_row_mass, chunk_row_mass_launch, _row_mass_fake
)


def _current(call) -> bool:
    """Whether the call launches the module's kernels of now (the AOT compile gate swaps in stand-ins)."""
    if type(call) is _RowMassCall:
        return call.kernels[0] is _row_mass_kernel
    return call.kernels[0] is _row_lse_kernel and call.kernels[1] is _column_mass_kernel


_PREPARE = {"chunk_attention_scores": _prepare_scores, "chunk_row_mass": _prepare_row_mass}
_RUN = {_ScoresCall: _run_scores, _RowMassCall: _run_row_mass}


def _run(op_name, op, impl, q, k, lens, k_extra, sm_scale, backend, q_tokens_are_chunk):
    backend = _dispatch.resolve_backend(backend, q.device) if isinstance(q, torch.Tensor) else backend
    # type(sm_scale): 1 == True == 1.0 as keys, but a bool scale must still raise
    sig = V.signature(op_name, (q, k, lens, k_extra), (sm_scale, type(sm_scale), backend, _plan.assumed_gpu()))
    call = V.recall(sig)
    if call is None or (type(call) in _RUN and not _current(call)):  # metadata checks, memoised per
        # metadata signature with the prepared call (made again when its kernels were swapped)
        _validate(op_name, q, k, lens, k_extra, sm_scale, q_tokens_are_chunk)
        if backend == "triton":  # the torch reference takes any D
            V.check_head_dim(op_name, q.shape[-1])
            if sig is not None:
                scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
                call = _PREPARE[op_name](q, k, lens, k_extra, scale)
        V.remember(sig, call)
    run = _RUN.get(type(call))
    if run is not None and _dispatch.eager():  # the prepared call: allocate, launch
        if _dispatch.values_checked(call.device_type):
            V.check_lens_values(op_name, lens, k.shape[1])
        return run(call, q, k, lens, k_extra)
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    return call_op(op, impl, q, k, lens, k_extra, scale, backend)


def chunk_attention_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    lens: torch.Tensor | None = None,
    k_extra: torch.Tensor | None = None,
    *,
    sm_scale: float | None = None,
    backend: str | None = None,
):
    """Attention mass each chunk key receives from the scoring queries.

    For chunk ``n`` every scoring query (``M`` tokens x ``Hq`` heads) attends
    bidirectionally over the chunk's valid keys ``k[n, :lens[n]]`` plus the extra
    keys ``k_extra[n]`` (typically the scoring tokens' own keys). The softmax
    probability each key receives is summed over the ``M`` queries and the ``G``
    query heads of its KV group.

    Args:
        q: ``[N, M, Hq, D]`` scoring queries per chunk (fp32/fp16/bf16).
        k: ``[N, T, Hkv, D]`` chunk keys, same dtype.
        lens: ``[N]`` int32/int64 valid chunk keys, each in ``0..T``; None = all T.
        k_extra: ``[N, E, Hkv, D]`` extra keys every query also sees, or None (E = 0).
        sm_scale: softmax scale, default ``1/sqrt(D)``.
        backend: ``"triton"``, ``"torch"`` or None (auto; see :mod:`triton_kernels._dispatch`).

    Returns:
        ``(mass [N, Hkv, T] fp32, extra_mass [N, Hkv, E] fp32, lse [N, M, Hq] fp32)``:
        probability mass (unitless, in ``[0, M*G]``; 0 beyond ``lens``), and each
        query row's natural-log LSE over all its keys (``-inf`` if it has none).
        ``mass.sum(-1) + extra_mass.sum(-1) == M * G`` whenever a row has keys.
        A non-finite logit (NaN/inf in a query row or a valid key, or ``q . k * sm_scale``
        beyond fp32) makes that row's ``lse`` NaN and with it the whole ``mass`` and
        ``extra_mass`` of its (chunk, KV head), on every backend (the rule of
        :mod:`triton_kernels.reference`); ``topb_gather`` then rejects those scores.

    Raises:
        TypeError: unsupported or mismatched dtypes; lens not int32/int64.
        ValueError: sm_scale NaN or infinite; bad ranks/shapes (the message states the expected
            layout and names a tensor that looks like SDPA's ``[N, H, L, D]``), ``D = 0``,
            N/D/Hkv mismatch between q, k, k_extra,
            ``Hq % Hkv != 0``, unsupported D, device mismatch, last dim not
            contiguous; lens outside ``[0, T]`` where the host value checks run (CPU, the torch
            backend, the checked mode). Where they do not (CUDA by default, any backend inside
            :func:`triton_kernels.skip_value_checks`) that chunk's outputs are NaN instead and
            :func:`triton_kernels.check_errors` raises later (no host sync per call).
        RuntimeError: ``backend="triton"`` on CPU without ``TRITON_INTERPRET=1``.

    Algorithm: Prefilling-dLLM intra-chunk scoring; FlashAttention-2 online
    softmax for the row LSEs (pass 1, split over the keys when N is small), then a
    column pass that recomputes ``Q K^T`` per key tile and sums ``exp(s - lse)`` (as
    FlashAttention's backward recomputes P). Never stores an ``[M, T]`` score matrix;
    costs two ``Q K^T``.
    """
    return _run("chunk_attention_scores", _chunk_scores_op, _scores_impl, q, k, lens, k_extra, sm_scale, backend, False)


def chunk_row_mass(
    q: torch.Tensor,
    k: torch.Tensor,
    lens: torch.Tensor | None = None,
    k_extra: torch.Tensor | None = None,
    *,
    sm_scale: float | None = None,
    backend: str | None = None,
):
    """Attention mass each chunk token sends to the extra (scoring) keys.

    Chunk row ``t < lens[n]`` attends over the valid chunk keys plus
    ``k_extra[n]``; its mass on the extra keys is ``exp(lse_extra - lse_all)``,
    summed over the ``G`` query heads of each KV head. The other direction of
    :func:`chunk_attention_scores`; add the two for a bidirectional score.

    Args:
        q: ``[N, T, Hq, D]`` the chunk tokens' own queries (fp32/fp16/bf16).
        k: ``[N, T, Hkv, D]`` chunk keys, same dtype.
        lens: ``[N]`` int32/int64 valid chunk tokens in ``0..T``; None = all T.
        k_extra: ``[N, E, Hkv, D]`` the scoring tokens' keys; None or E = 0 gives zeros.
        sm_scale: softmax scale, default ``1/sqrt(D)``.
        backend: ``"triton"``, ``"torch"`` or None (auto).

    Returns:
        ``[N, Hkv, T]`` fp32 probability mass in ``[0, G]``; 0 for rows ``t >= lens[n]``;
        NaN for a row with a non-finite logit (as :func:`chunk_attention_scores`).

    Raises:
        TypeError / ValueError / RuntimeError: as :func:`chunk_attention_scores`,
        plus ValueError when q and k disagree on T.

    Algorithm: Prefilling-dLLM intra-chunk scoring (chunk -> query direction);
    two FlashAttention-2 online-softmax LSEs per row (chunk keys, extra keys),
    combined as ``l_x 2^(m_x - m) / (l_c 2^(m_c - m) + l_x 2^(m_x - m))``.
    """
    return _run("chunk_row_mass", _chunk_row_mass_op, _row_mass_impl, q, k, lens, k_extra, sm_scale, backend, True)
