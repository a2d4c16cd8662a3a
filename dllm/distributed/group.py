"""The process group of a sharded run: joining it (torchrun's environment), and the two rules every
collective step of :mod:`dllm.distributed` follows.

- :func:`run_on_all`: a step runs on every rank, then the ranks agree on whether all succeeded; an
  exception on any rank is raised on every rank as the same :class:`RankError`, so no rank waits forever
  for a peer that failed.
- :func:`read_on_root`: what comes from outside (stdin, a FIFO, a file that may change) is read by one
  rank and broadcast, so every rank works on the same bytes and a pipe is read once.

Without an initialised process group everything runs in this one process (rank 0 of 1).
"""

from __future__ import annotations

import datetime
import os
import traceback

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 1800.0  # collectives' timeout of init_from_env (PREFILLING_DLLM_DIST_TIMEOUT overrides)
USER_ERRORS = (ValueError, TypeError, OSError, KeyError)  # a rank's bad input, not a bug


class RankError(RuntimeError):
    """An exception raised on one rank, raised on every rank of the group by :func:`run_on_all`.

    Attributes:
        rank: the first rank that failed (-1: the collective itself failed, a peer left the group).
        kind: the original exception's class name.
        message: its message.
        user_error: the original was a ``ValueError``, ``TypeError``, ``OSError`` or ``KeyError`` (bad
            input: the CLI reports it as one ``error:`` line with status 2) rather than a bug.
        trace: the failing rank's formatted traceback.
        failed: ``[(rank, kind, message), ...]`` of every rank that failed.
    """

    def __init__(self, rank: int, kind: str, message: str, user_error: bool, trace: str = "", failed=()):
        where = f"rank {rank}" if rank >= 0 else "a rank"
        super().__init__(f"{where}: {message}")
        self.rank, self.kind, self.message, self.user_error, self.trace = rank, kind, message, user_error, trace
        self.failed = list(failed)


def distributed() -> bool:
    """A process group is initialised (else every function runs in this one process)."""
    return dist.is_available() and dist.is_initialized()


def world(group=None) -> tuple[int, int]:
    """(rank, world size) in ``group``; (0, 1) without an initialised process group."""
    if not distributed():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def run_on_all(fn, group=None):
    """Run ``fn()`` on this rank, then agree with every rank of ``group`` on whether all succeeded.

    Returns:
        ``fn()``'s value when it succeeded on every rank.

    Raises:
        RankError: on every rank alike when ``fn`` raised on any rank (the first failing rank, its
            exception's class, message and traceback); also when the agreement collective itself fails
            (a peer died: ``rank`` -1). Without a process group ``fn``'s own exception propagates.
    """
    if not distributed():
        return fn()
    result, mine = None, None
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - any exception must reach the peers, or they would wait forever
        mine = (type(exc).__name__, " ".join(str(exc).split()) or type(exc).__name__,
                isinstance(exc, USER_ERRORS), traceback.format_exc())  # fmt: skip
    _rank, size = world(group)
    reports = [None] * size
    try:
        dist.all_gather_object(reports, mine, group=group)
    except Exception as exc:  # noqa: BLE001 - the backend's error type varies (gloo: RuntimeError, DistBackendError)
        first = " ".join(str(exc).split())[:300]
        raise RankError(-1, type(exc).__name__, f"the process group failed (a rank left?): {first}", False) from exc
    failed = [(r, rep) for r, rep in enumerate(reports) if rep is not None]
    if failed:
        r, (kind, msg, user, trace) = failed[0]
        raise RankError(r, kind, msg, user, trace, [(q, rep[0], rep[1]) for q, rep in failed])
    return result


def broadcast(obj, src: int = 0, group=None):
    """``obj`` of rank ``src`` (a picklable object) on every rank of ``group``; ``obj`` itself without a group."""
    if not distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, group_src=src, group=group)
    return box[0]


def all_gather(obj, group=None) -> list:
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` without a group."""
    _rank, size = world(group)
    if size == 1:
        return [obj]
    out = [None] * size
    dist.all_gather_object(out, obj, group=group)
    return out


def read_on_root(fn, group=None, root: int = 0):
    """``fn()`` run on rank ``root`` only and its value broadcast to every rank of ``group``.

    For inputs that must be read once: stdin (``--questions-file -``), a FIFO (a second reader would wait
    forever for a writer that already left), a file another process may rewrite between two ranks' reads.

    Raises:
        RankError: on every rank when ``fn`` raised on ``root`` (its message: the CLI prints it as one
            ``error:`` line); without a process group ``fn``'s own exception.
    """
    rank, _size = world(group)
    value = run_on_all(lambda: fn() if rank == root else None, group)
    return broadcast(value, root, group)


def _timeout_from_env() -> float:
    """``PREFILLING_DLLM_DIST_TIMEOUT`` as seconds in (0, 1e9) (default :data:`DEFAULT_TIMEOUT_S`); anything else
    ('abc', 'inf', '0') is a ValueError naming the variable, not a traceback from deep inside torch's rendezvous."""
    raw = os.environ.get("PREFILLING_DLLM_DIST_TIMEOUT")
    if raw is None or not raw.strip():
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value < 1e9:  # (False for NaN)
        raise ValueError(f"PREFILLING_DLLM_DIST_TIMEOUT must be a number of seconds in (0, 1e9), got {raw!r}")
    return value


def init_from_env(device: str | None = None, *, timeout_s: float | None = None) -> str:
    """Initialise the default process group from torchrun's environment and return this rank's device.

    ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` are read from the
    environment (``init_method="env://"``, as torchrun sets them). A CUDA device (``device`` "cuda",
    or None with CUDA available) gives NCCL with one GPU per rank (``cuda:LOCAL_RANK``, made the
    current device); anything else gloo on the CPU.

    Args:
        device: ``cuda``, ``cpu`` or None (CUDA when available).
        timeout_s: the collectives' timeout in seconds (default ``PREFILLING_DLLM_DIST_TIMEOUT`` or
            :data:`DEFAULT_TIMEOUT_S`): a rank waits this long for a peer that neither answers nor fails.

    Returns:
        The device string of this rank (``cuda:LOCAL_RANK`` or ``cpu``).

    Raises:
        ValueError: ``WORLD_SIZE``/``RANK`` missing or not integers, ``device`` cuda without CUDA, or
            fewer GPUs than local ranks; a timeout (``PREFILLING_DLLM_DIST_TIMEOUT`` or ``timeout_s``) that is not
            a number of seconds in (0, 1e9).
    """
    try:
        size, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
        local = int(os.environ.get("LOCAL_RANK", rank))
    except (KeyError, ValueError) as exc:
        raise ValueError(
            f"WORLD_SIZE, RANK (and LOCAL_RANK) must be set to integers, as torchrun does ({exc})"
        ) from None
    if timeout_s is None:
        timeout_s = _timeout_from_env()
    elif not (isinstance(timeout_s, (int, float)) and not isinstance(timeout_s, bool) and 0 < timeout_s < 1e9):
        raise ValueError(f"timeout_s must be a number of seconds in (0, 1e9), got {timeout_s!r}")
    want_cuda = (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    if want_cuda:
        if not torch.cuda.is_available():
            raise ValueError("device cuda was asked for but CUDA is not available")
        if local >= torch.cuda.device_count():
            raise ValueError(f"local rank {local} has no GPU: {torch.cuda.device_count()} visible; one GPU per rank")
        torch.cuda.set_device(local)
        dev, backend = f"cuda:{local}", "nccl"
    else:
        dev, backend = "cpu", "gloo"
    if not dist.is_initialized():
        dist.init_process_group(
            backend, rank=rank, world_size=size, timeout=datetime.timedelta(seconds=timeout_s),
            **({"device_id": torch.device(dev)} if backend == "nccl" else {}),
        )  # fmt: skip
    return dev
