"""The ``python -m dllm`` parser, its description, and :func:`main`, the entry point of every command.

One module per command (:mod:`~dllm.cli.generate`, :mod:`~dllm.cli.encode`, :mod:`~dllm.cli.eval`,
:mod:`~dllm.cli.info`) declares its subcommand (``add_parser``) and runs it (``cmd_*``); under torchrun,
``generate`` and ``encode`` run on every rank instead (:mod:`dllm.cli.distributed`). What a failure prints
and the exit status it gives: :mod:`dllm.cli.errors`.

Imports: every module of :mod:`dllm.cli`.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

from dllm.cli import encode, errors, generate, info
from dllm.cli import eval as eval_command
from dllm.cli.args import HelpFormatter, Parser, examples_text, model_in_argv
from dllm.cli.options import backend_check

COMMANDS = (generate, encode, eval_command, info)  # in the order of the help

DESCRIPTION = f"""\
Long-context inference of diffusion LMs (Dream, LLaDA) with Prefilling-dLLM.

examples (each runs as written on the bundled tiny model, given the files described below):
{examples_text([line for command in COMMANDS for line in command.EXAMPLES])}

{generate.EXAMPLE_FILES}
{eval_command.EXAMPLE_FILES}

A user error (a missing file, a bad option value, an empty context, --top-k above the number of
chunks, ...) prints one line "error: ..." and exits with status 2, as does running out of memory (the
line says what to lower); Ctrl-C exits with status 130. --debug shows the traceback instead.
The demo and the benchmarks live in bench/ of the repository (make demo, make bench)."""


def build_parser(model_dir: str | None = None) -> argparse.ArgumentParser:
    """The ``python -m dllm`` parser (its subcommands' help texts hold the runnable examples); the help shows
    the prefilling defaults of the checkpoint ``model_dir`` (default: the bundled model)."""
    p = Parser(prog="python -m dllm", description=DESCRIPTION, formatter_class=HelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.add_parser(sub, model_dir)
    return p


def _torchrun() -> bool:
    """Launched by torchrun (``WORLD_SIZE`` set): ``encode`` and ``generate`` run on every rank
    (:mod:`dllm.cli.distributed`: a sharded document, distributed chunk scoring, rank 0 decodes)."""
    return "WORLD_SIZE" in os.environ


def _dispatch(args) -> int:
    backend_check(args)
    if args.command in ("generate", "encode") and _torchrun():
        from dllm.cli import distributed

        return distributed.cmd_generate(args) if args.command == "generate" else distributed.cmd_encode(args)
    return args.func(args)


def main(argv=None) -> int:
    """Run the command line; returns the exit status (0; 2 for a user error; 130 after Ctrl-C).

    User errors (bad options or paths, invalid values that the library rejects with ``ValueError``,
    files that cannot be read or written) and running out of GPU or CPU memory (with what to lower)
    print one ``error:`` line on stderr; Ctrl-C prints ``interrupted``. With ``--debug`` the exception
    propagates with its traceback. Other exceptions (bugs) always propagate (:func:`dllm.cli.errors.run`).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    return errors.run(argv, lambda a: build_parser(model_in_argv(a)).parse_args(a), _noted_once)


def _noted_once(args):
    """:func:`_dispatch` without the library's warnings that the commands note themselves, in their own words
    and once per input (the trained window, characters the tokenizer drops)."""
    from dllm.generate import PositionWindowWarning
    from dllm.model.tokenization import UnencodableCharactersWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PositionWindowWarning)
        warnings.simplefilter("ignore", UnencodableCharactersWarning)
        return _dispatch(args)
