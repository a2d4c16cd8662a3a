"""The command line's error policy, in one place: what a user error is, how running out of memory is
reported, and the exit statuses.

A user error (:class:`UserError`, and the ``ValueError`` / ``OSError`` the library raises for bad values
and unreadable files) prints one ``error:`` line and exits with status 2; running out of GPU or CPU memory
does too, with what to lower (:data:`_OOM_HINTS`); Ctrl-C exits with 130. ``--debug`` re-raises instead.
Any other exception is a bug and propagates with its traceback.

Imports: the standard library and torch only (every module of :mod:`dllm.cli` imports this one).
"""

from __future__ import annotations

import re
import sys


class UserError(Exception):
    """A mistake in the command line or its inputs: reported as one ``error:`` line, exit status 2."""


# what to lower when a command runs out of memory (its options that size the tensors)
_OOM_HINTS = {
    "generate": (
        "lower --gen-length or the context's length (with --method prefilling: --top-k, --token-budget, "
        "--prefill-batch)"
    ),
    "encode": "lower --prefill-batch (chunks per forward) or --chunk-size",
    "eval": "lower --lengths or --gen-length (with --method prefilling: --top-k, --token-budget, --prefill-batch)",
}
_CPU_OOM = re.compile(r"DefaultCPUAllocator: (can't allocate|not enough) memory", re.IGNORECASE)


def _out_of_memory(exc: BaseException) -> str | None:
    """Where ``exc`` ran out of memory ("the GPU", "CPU memory"), or None when it is no allocation failure."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return "the GPU"
    if isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and _CPU_OOM.search(str(exc))):
        return "CPU memory"
    return None


def _oom_line(exc: BaseException, where: str, command: str | None) -> str:
    size = re.search(r"tried to allocate ([\d.]+ ?[KMGT]i?B|\d+ bytes)", str(exc), re.IGNORECASE)
    asked = f", tried to allocate {size[1]}" if size else ""
    hint = _OOM_HINTS.get(command, "use smaller inputs")
    return f"out of memory ({where}{asked}): {hint}, or a 16-bit --dtype (--debug shows the traceback)"


def run(argv: list[str], parse, dispatch) -> int:
    """Parse ``argv`` with ``parse`` (returns the ``argparse.Namespace``, whose ``command`` names the
    subcommand) and run it with ``dispatch``; returns the exit status under the policy of this module.

    Raises:
        The exception itself with ``--debug`` in ``argv``, and always for exceptions that are bugs.
    """
    debug = "--debug" in argv
    command = None
    try:
        args = parse(argv)
        command = args.command
        return dispatch(args)
    except (UserError, ValueError, OSError) as exc:
        if debug:
            raise
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except (RuntimeError, MemoryError) as exc:
        where = _out_of_memory(exc)
        if where is None or debug:  # any other RuntimeError is a bug: its traceback is the report
            raise
        print(f"error: {_oom_line(exc, where, command)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if debug:
            raise
        print("interrupted", file=sys.stderr)
        return 130  # 128 + SIGINT, as a shell reports a program stopped by Ctrl-C


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    return " ".join(str(exc).split()) or type(exc).__name__
