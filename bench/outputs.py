"""Where the demo and the benchmarks write: ``runs/`` (git-ignored) unless a recording is asked for.

``make demo`` and ``make bench`` write to ``runs/demo/`` and ``runs/bench/``, so running them leaves
``git status`` clean. The recorded results under ``bench/results/`` change only with ``--record``
(``make record``); ``--out DIR`` writes anywhere else.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from bench.provenance import machine_line, write_csv

REPO_ROOT = Path(__file__).resolve().parents[1]
RUNS_DIR = REPO_ROOT / "runs"  # git-ignored
RESULTS_DIR = REPO_ROOT / "bench" / "results"  # recorded, tracked


def add_output_args(parser: argparse.ArgumentParser, runs_sub: str, results_sub: str = "") -> None:
    """``--out DIR`` and ``--record`` (mutually exclusive); the help names both default folders."""
    runs, results = _rel(RUNS_DIR / runs_sub), _rel(RESULTS_DIR / results_sub)
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--out", default=None, help=f"output folder (default: {runs}, git-ignored)")
    g.add_argument("--record", action="store_true", help=f"rewrite the recorded results in {results} instead")


def study_parser(doc: str, runs_sub: str, results_sub: str = "") -> argparse.ArgumentParser:
    """A benchmark's command line: ``doc`` (its module docstring) as the description, laid out as written, and
    the options of :func:`add_output_args` first."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_output_args(parser, runs_sub, results_sub)
    return parser


def output_dir(args: argparse.Namespace, runs_sub: str, results_sub: str = "") -> Path:
    """The folder of :func:`add_output_args`'s options: ``--out``, else the recorded folder with
    ``--record``, else ``runs/<runs_sub>``."""
    if args.out is not None:
        return Path(args.out)
    return RESULTS_DIR / results_sub if args.record else RUNS_DIR / runs_sub


def parse_study(parser: argparse.ArgumentParser, argv, runs_sub: str = "bench") -> tuple[argparse.Namespace, Path]:
    """A CPU study's command line: ``parser`` with the options of :func:`add_output_args` added last, parsed
    from ``argv``; returns the arguments and the output folder (:func:`output_dir`), created. Torch then runs
    on 2 threads, the setting the studies are recorded with."""
    import torch

    add_output_args(parser, runs_sub)
    args = parser.parse_args(argv)
    out = output_dir(args, runs_sub)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    return args, out


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


def save_text(folder, name: str, text: str) -> Path:
    """Write ``text`` as it is to ``folder/name`` (the folder created if need be) and print it; returns the path."""
    path = Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(text)
    return path


def write_report(path, title: str, module: str, argv, device: str, seconds: float, paragraphs: list[str]) -> str:
    """Write a study's Markdown report to ``path`` and print it: the title, the command that made it
    (``python -m <module>`` with ``argv``, or this process's arguments when ``argv`` is None), the
    machine line with ``seconds`` of run time, then ``paragraphs`` separated by blank lines.

    Returns the text written. Raises ``OSError`` if ``path`` cannot be written.
    """
    args = sys.argv[1:] if argv is None else argv
    # paths inside the repository as a user would type them (not this machine's absolute prefix)
    cmd = f"python -m {module} " + shlex.join(str(a).replace(f"{REPO_ROOT}/", "") for a in args)
    head = [f"# {title}", "", f"Command: `{cmd}`  ", f"{machine_line(device)}; {seconds:.0f} s in all."]
    text = "\n\n".join(["\n".join(head), *paragraphs])
    with open(path, "w") as f:
        f.write(text + "\n")
    print(text)
    return text


def write_results(out, stem: str, rows: list[dict], module: str, argv, seconds: float, title: str, paragraphs) -> str:
    """A CPU study's results in the folder ``out`` (created if need be): ``rows`` in ``<stem>.csv``
    (:func:`bench.provenance.write_csv`) and the report in ``<stem>.md`` (:func:`write_report`, device "cpu").

    Returns the report's text. Raises ``OSError`` if a file cannot be written.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / f"{stem}.csv", rows, "cpu")
    return write_report(out / f"{stem}.md", title, module, argv, "cpu", seconds, paragraphs)
