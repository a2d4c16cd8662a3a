"""The files a command reads and writes: UTF-8 inputs of bounded size (regular files, pipes, a terminal)
and ``--out`` paths checked before any work is done.

Imports: :mod:`dllm.cli.errors` and the standard library.
"""

from __future__ import annotations

import os
import sys

from dllm.cli.errors import UserError

MAX_INPUT_BYTES = 1 << 30  # 1 GiB of text is ~250M tokens: far past any context this package encodes


def read_text(path: str, what: str) -> str:
    """A UTF-8 text file, pipe or terminal, at most :data:`MAX_INPUT_BYTES`, without a leading byte order mark
    (:func:`decode_utf8`). Opening a FIFO blocks until a writer opens it: after a second of waiting, stderr
    says so (a silent hang looks like a crash)."""
    import threading

    waiting = threading.Timer(1.0, lambda: print(f"waiting for a writer on {what} {path} ...", file=sys.stderr))
    waiting.daemon = True
    waiting.start()
    try:
        f = open(path, "rb")
    finally:
        waiting.cancel()
    with f:
        data = f.read(MAX_INPUT_BYTES + 1)
    if len(data) > MAX_INPUT_BYTES:
        raise UserError(f"{what} {path}: more than {MAX_INPUT_BYTES:,} bytes of text")
    try:
        return decode_utf8(data)
    except UnicodeDecodeError:
        raise UserError(f"{what} {path}: not UTF-8 text") from None


def decode_utf8(data: bytes) -> str:
    """UTF-8 text of ``data``; a byte order mark at its start (an editor's ``EF BB BF``) is skipped, as the JSON
    reader skips it: it marks the encoding, it is not text of the prompt, context or questions.

    Raises:
        UnicodeDecodeError: not UTF-8.
    """
    return data.decode("utf-8-sig")


def strip_one_newline(text: str) -> str:
    """Remove the one line ending an editor adds at the end of a file (``\\n`` or ``\\r\\n``)."""
    if text.endswith("\r\n"):
        return text[:-2]
    return text[:-1] if text.endswith("\n") else text


def check_out(out: str, create_folder: bool = False) -> None:
    """``--out``: a file name (not a folder) in an existing folder. Only our default folder (runs/) is
    created (``create_folder``): a mistyped path must not create folders."""
    if os.path.isdir(out):
        raise UserError(f"--out {out} is a directory; give a file name")
    if os.path.exists(out) and not os.path.isfile(out):  # /dev/null, a FIFO: never replaced by a file
        raise UserError(f"--out {out} exists and is not a regular file")
    folder = os.path.dirname(os.path.abspath(out))
    if not create_folder and not os.path.isdir(folder):
        raise UserError(f"--out {out}: no such directory {folder}")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out {out}: cannot create its folder ({exc.strerror or exc})") from exc


def same_file(a: str, b: str) -> bool:
    """Whether the paths ``a`` and ``b`` name one existing file (under any name: a symlink, a hard link); a path
    that cannot be examined (a pipe that is gone once read) names none."""
    try:
        return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)
    except OSError:
        return False


def refuse_overwriting_inputs(out: str, inputs: dict, harm: str) -> None:
    """``--out`` must not be a file the command reads: ``inputs`` maps each reading flag (``"--data"``) to its
    path (None = not given); ``harm`` says what would be lost. Raises :class:`UserError` naming both flags."""
    for flag, path in inputs.items():
        if path is not None and same_file(out, path):
            raise UserError(f"--out {out} is the {flag}: {harm}")


def read_document_to_encode(args, also_written=()) -> str:
    """``encode``'s inputs, checked before any work: the ``--context-file`` text (not blank) and an ``--out``
    file name that can be written (:func:`check_out`) and is not the ``--context-file`` itself (under any
    name: a symlink, a hard link); in one process or under torchrun, where ``also_written`` names the shard
    files written beside ``--out``, none of which may be the ``--context-file`` either."""
    text = read_text(args.context_file, "--context-file")
    if not text.strip():
        raise UserError(f"--context-file {args.context_file} is empty")
    if not args.out.strip():
        raise UserError("--out is empty; give a file name")
    check_out(args.out)
    refuse_overwriting_inputs(
        args.out, {"--context-file": args.context_file}, "the cache would overwrite the document's text"
    )
    for out in also_written:
        if same_file(out, args.context_file):
            raise UserError(
                f"--context-file {args.context_file} is the shard {out} that encode writes beside --out {args.out}: "
                "the cache would overwrite the document's text"
            )
    return text
