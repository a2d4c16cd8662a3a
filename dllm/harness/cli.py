"""``python -m dllm.harness ARGS``: lm-evaluation-harness's own command line, ``prefilling-dllm`` registered.

ARGS are the harness's (``lm-eval run --help``; ``run`` may be left out, as with ``lm-eval`` itself).
Without ``--model`` the model is ``prefilling-dllm``; without ``--device``, cuda where
available, else cpu (the harness's own default is cuda:0 everywhere). Ours on top: ``--help-model-args`` lists the
``--model_args`` keys, ``--debug`` shows tracebacks. A bad ``--model_args`` key or value, a task or
prompt our model cannot serve, or a missing lm-eval prints one ``error:`` line and exits with status 2.
"""

from __future__ import annotations

import sys

from dllm.harness import MODEL_NAME

_HARNESS_COMMANDS = ("run", "ls", "validate")


def _has_option(argv: list, *names: str) -> bool:
    return any(a in names or any(a.startswith(n + "=") for n in names) for a in argv)


def main(argv=None) -> int:
    """Run the harness's CLI on ``argv`` (default ``sys.argv[1:]``) with our model registered.

    Returns:
        0 on success; 2 after a one-line ``error:`` (bad model args, ValueError of a request or task,
        lm-eval not installed); the harness's own argparse errors exit through ``SystemExit`` (2).

    Raises:
        Any other exception (a bug) with its traceback; with ``--debug`` every exception.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    if "--help-model-args" in argv:
        from dllm.harness.args import describe_model_args

        print(f"--model_args keys of {MODEL_NAME} (key=value,key=value; none / all where allowed):")
        print(describe_model_args())
        return 0
    try:
        from lm_eval._cli import HarnessCLI

        import dllm.harness.model  # noqa: F401  (registers the model)
    except ImportError as exc:
        if debug:
            raise
        print(f"error: lm-eval is not installed ({exc}): pip install -e '.[harness]'", file=sys.stderr)
        return 2
    if argv and argv[0] not in _HARNESS_COMMANDS and not argv[0].startswith("-h"):
        argv.insert(0, "run")
    if argv and argv[0] == "run":
        if not _has_option(argv, "--model", "-M"):
            argv[1:1] = ["--model", MODEL_NAME]
        if not _has_option(argv, "--device"):  # the harness's default is cuda:0 even without CUDA
            import torch

            argv[1:1] = ["--device", "cuda" if torch.cuda.is_available() else "cpu"]
    saved = sys.argv
    sys.argv = ["python -m dllm.harness", *argv]
    try:
        cli = HarnessCLI()
        cli.execute(cli.parse_args())
    except (ValueError, NotImplementedError) as exc:
        if debug:
            raise
        print(f"error: {' '.join(str(exc).split()) or type(exc).__name__}", file=sys.stderr)
        return 2
    finally:
        sys.argv = saved
    return 0
