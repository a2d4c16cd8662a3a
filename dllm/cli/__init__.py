"""The command line, ``python -m dllm generate|encode|eval|info`` (installed as ``dllm`` too).

:func:`main` is the entry point (:mod:`~dllm.cli.parser`); ``python -m dllm --help`` prints the runnable
examples. Modules: one per command (:mod:`~dllm.cli.generate`, :mod:`~dllm.cli.encode`, :mod:`~dllm.cli.eval`,
:mod:`~dllm.cli.info`, and :mod:`~dllm.cli.distributed` for generate and encode under torchrun), the argument
types and shared argument groups (:mod:`~dllm.cli.args`), the checks that turn options into the library's
settings (:mod:`~dllm.cli.options`), the files a command reads and writes (:mod:`~dllm.cli.files`), and the
error policy with the out-of-memory report (:mod:`~dllm.cli.errors`).

Imports: anything below it (the public API :mod:`dllm`, :mod:`dllm.eval`, :mod:`dllm.distributed`,
:mod:`dllm.prefilling`, :mod:`dllm.decode`, :mod:`dllm.model`); nothing in ``dllm`` imports the CLI.
"""

from dllm.cli.parser import build_parser, main

__all__ = ["build_parser", "main"]
