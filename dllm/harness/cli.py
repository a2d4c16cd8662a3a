"""``python -m dllm.harness ARGS``: lm-evaluation-harness's own command line, ``prefilling-dllm`` registered.

ARGS are the harness's (``lm-eval run --help``; ``run`` may be left out, as with ``lm-eval`` itself).
Without ``--model`` the model is ``prefilling-dllm``; without ``--device``, cuda where
available, else cpu (the harness's own default is cuda:0 everywhere). Ours on top: ``--help-model-args`` lists the
``--model_args`` keys, ``--debug`` shows tracebacks. A bad ``--model_args`` key or value, a task or
prompt our model cannot serve, a missing lm-eval, or a package a task imports and lm-eval does not install
(LongBench's jieba, fuzzywuzzy, rouge: ``pip install -e '.[longbench]'``) prints one ``error:`` line and exits
with status 2.
"""

from __future__ import annotations

import sys

from dllm.harness import MODEL_NAME

_HARNESS_COMMANDS = ("run", "ls", "validate")
# modules lm-eval's tasks import that lm-eval itself does not install -> our extra that installs them
# (lm-eval's own extra of the same name: lm-eval's pyproject, [project.optional-dependencies])
TASK_EXTRAS = {"jieba": "longbench", "fuzzywuzzy": "longbench", "rouge": "longbench"}


def _has_option(argv: list, *names: str) -> bool:
    return any(a in names or any(a.startswith(n + "=") for n in names) for a in argv)


def main(argv=None) -> int:
    """Run the harness's CLI on ``argv`` (default ``sys.argv[1:]``) with our model registered.

    Returns:
        0 on success; 2 after a one-line ``error:`` (bad model args, ValueError of a request or task,
        lm-eval not installed, a task's package not installed: :func:`missing_package_line`); the harness's own
        argparse errors exit through ``SystemExit`` (2).

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
    from dllm.harness.args import ModelArgsError, check_model_args_text

    try:  # before lm-eval types the values (it reads chunk_size=٣ as 3)
        for text in model_args_texts(argv):
            check_model_args_text(text)
    except ModelArgsError as exc:
        if debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
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
        missing = missing_task_package(argv)
        if missing is not None and not debug:
            print(f"error: {_extra_line(missing)}", file=sys.stderr)
            return 2
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
    except ImportError as exc:  # a task's own requirement (LongBench's metrics import jieba, ...)
        if debug:
            raise
        print(f"error: {missing_package_line(exc)}", file=sys.stderr)
        return 2
    finally:
        sys.argv = saved
    return 0


def missing_module(exc: BaseException) -> str | None:
    """The top-level name of the module whose import failed in ``exc`` or the exceptions it was raised from
    or while handling (lm-eval's tasks re-raise a bare ImportError of their own); None when none says."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ImportError) and exc.name:
            return exc.name.split(".")[0]
        exc = exc.__cause__ or exc.__context__
    return None


def missing_package_line(exc: ImportError) -> str:
    """The one ``error:`` line of a task that imports a package not installed: the module and what installs it
    (our extra for the packages of :data:`TASK_EXTRAS`, else lm-eval's own message)."""
    name = missing_module(exc)
    if name in TASK_EXTRAS:
        return _extra_line(name)
    what = f"the '{name}' package" if name else "a package"
    own = " ".join(str(exc).split()) or type(exc).__name__
    return f"the task needs {what}, which is not installed: install it, then run again ({own})"


def _extra_line(name: str) -> str:
    extra = TASK_EXTRAS[name]
    packages = ", ".join(k for k, v in TASK_EXTRAS.items() if v == extra)
    return (
        f"the task needs the '{name}' package ({extra}: {packages}), which lm-eval does not install: "
        f"pip install -e '.[{extra}]'"
    )


def model_args_texts(argv: list) -> list[str]:
    """The ``--model_args`` / ``-a`` values in the harness's ``argv`` (``nargs='+'``: every word up to the next
    option, or ``--model_args=TEXT``), as typed."""
    texts, taking = [], False
    for a in argv:
        if a.startswith("--model_args=") or a.startswith("-a="):
            texts.append(a.split("=", 1)[1])
            taking = False
        elif a in ("--model_args", "-a"):
            taking = True
        elif taking and not a.startswith("-"):
            texts.append(a)
        else:
            taking = False
    return texts


def requested_tasks(argv: list) -> list[str]:
    """The task names of ``--tasks`` / ``-t`` in the harness's ``argv`` (space- or comma-separated, or
    ``--tasks=a,b``), lowercased."""
    names, taking = [], False
    for a in argv:
        if a.startswith("--tasks=") or a.startswith("-t="):
            names += a.split("=", 1)[1].split(",")
            taking = False
        elif a in ("--tasks", "-t"):
            taking = True
        elif taking and not a.startswith("-"):
            names += a.split(",")
        else:
            taking = False
    return [n.strip().lower() for n in names if n.strip()]


def missing_task_package(argv: list) -> str | None:
    """The first package of :data:`TASK_EXTRAS` that a requested task needs and that is not installed (a
    LongBench task: ``longbench*``), found before the harness loads the model (it loads the tasks, whose
    metrics import these packages, only after the weights); None when nothing is missing as far as we know."""
    import importlib.util

    if not any(t.startswith("longbench") for t in requested_tasks(argv)):
        return None
    for name, extra in TASK_EXTRAS.items():
        if extra == "longbench" and importlib.util.find_spec(name) is None:
            return name
    return None
