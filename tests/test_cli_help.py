"""The command line's --help: every default and choice shown, and every example it prints runs as written."""

import argparse
import re
import shlex

import pytest

from dllm.cli import build_parser
from tests.cli_files import run_cli, write_example_files


def _parsers():
    top = build_parser()
    subs = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices
    return top, subs


def test_help_shows_every_default_and_every_choice():
    top, subs = _parsers()
    for name, parser in subs.items():
        text = parser.format_help()
        formatter = parser._get_formatter()
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if action.option_strings and not action.required and not isinstance(action, argparse._StoreTrueAction):
                assert "default" in formatter._get_help_string(action), f"{name} {action.option_strings}"
            for choice in action.choices or ():
                assert str(choice) in text, f"{name} {action.dest} {choice}"
    assert "--help" in top.format_help() and "generate" in top.format_help()


def help_examples() -> list[str]:
    """Every command line printed by ``--help`` (the top level and each subcommand), once each."""
    top, subs = _parsers()
    found = []
    for text in [top.format_help()] + [p.format_help() for p in subs.values()]:
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("python -m dllm ") and line not in found:
                found.append(line)
    return found


def test_help_prints_examples_of_every_subcommand():
    examples = help_examples()
    assert {shlex.split(x)[3] for x in examples} == set(_parsers()[1])


# Run smaller than printed, to keep the suite fast: every other option stays at its default.
SMALLER = {"python -m dllm eval passkey --method prefilling": ["--samples", "1"]}  # 5 cases, not 25


@pytest.mark.parametrize("line", help_examples())
def test_help_example_runs(tmp_path, monkeypatch, capsys, line):
    monkeypatch.chdir(tmp_path)
    write_example_files(tmp_path)
    rc, out, err = run_cli(capsys, *shlex.split(line)[3:], *SMALLER.get(line, []))
    assert rc == 0, err
    command = shlex.split(line)[3]
    if command == "generate":
        assert "12345" in out
    elif command == "eval":  # it writes into runs/ of the working directory and reports its start-up apart
        written = re.search(r"wrote (\S+)", out).group(1)
        assert written.startswith("runs/") and (tmp_path / written).is_file()
        assert "start-up, not in the table" in out
    elif command == "encode":
        assert "wrote doc.cache" in out and (tmp_path / "doc.cache").is_file()
    else:
        assert command == "info" and "dream" in out
