"""The command line tests' shared inputs: the --help examples' files and one in-process CLI call."""

import json
import os
import shlex
from pathlib import Path

from dllm.cli import main

PROMPT = "There is a pass key hidden in the text below.\n\n{context}\n\nWhat is the pass key? The pass key is "
FILLER = "The grass is green. The sky is blue. "


LONGBENCH_SAMPLE = Path(__file__).parent / "tasks" / "data" / "longbench_tiny.jsonl"


def write_example_files(folder):
    """The input files of the --help examples as the help describes them: prompt.txt (with the newline an
    editor adds), ask.txt and questions.txt, doc.txt, and hotpotqa.jsonl (the hotpotqa lines of the test
    suite's LongBench sample)."""
    (folder / "prompt.txt").write_text(PROMPT + "\n")
    (folder / "ask.txt").write_text(PROMPT.replace("What is the pass key? ", "{question} ") + "\n")
    (folder / "questions.txt").write_text("What is the pass key?\nWhich number is hidden in the text?\n")
    (folder / "doc.txt").write_text(FILLER * 50 + "The pass key is 12345. Remember it. " + FILLER * 30)
    lines = [
        x for x in LONGBENCH_SAMPLE.read_text().splitlines() if x.strip() and json.loads(x)["dataset"] == "hotpotqa"
    ]
    assert lines
    (folder / "hotpotqa.jsonl").write_text("\n".join(lines * 2) + "\n")


def run_cli(capsys, *argv):
    """``python -m dllm *argv`` in this process: (exit code, stdout, stderr)."""
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def cli_notes(capsys, command: str) -> tuple[int, list, str]:
    """``python -m dllm <command>`` in this process: (exit code, its ``note: ...`` lines on stderr, stderr)."""
    rc, _, err = run_cli(capsys, *shlex.split(command))
    return rc, [line for line in err.splitlines() if line.startswith("note: ")], err


def unencodable_note(where: str, count: int, chars: str) -> str:
    """The note line the CLI prints once per input with characters the tokenizer cannot encode."""
    return f"note: {where}: {count} character(s) the model's tokenizer cannot encode are left out or replaced: {chars}"


def make_files(tmp_path, monkeypatch, test_name: str):
    """A working directory (``tmp_path``, made current) with the --help examples' files and the odd inputs the
    error tests read: empty, slot-less and latin-1 files, a deep JSON line, JSONL lines with no or a blank
    context or a 1600-token question, a named pipe nobody writes to. A test named for a misspelled backend or
    value-check setting gets that environment variable."""
    monkeypatch.chdir(tmp_path)
    if "misspelled backend" in test_name:
        monkeypatch.setenv("PREFILLING_DLLM_BACKEND", "tritn")
    if "misspelled check values" in test_name:
        monkeypatch.setenv("PREFILLING_DLLM_CHECK_VALUES", "on")
    write_example_files(tmp_path)
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "noslot.txt").write_text("What is the pass key? The pass key is ")
    (tmp_path / "slot_last.txt").write_text("Read this: {context}")
    (tmp_path / "latin1.jsonl").write_bytes('{"input": "caf\xe9"}\n'.encode("latin-1"))
    (tmp_path / "deep.jsonl").write_text('{"input": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    hotpot = json.loads((tmp_path / "hotpotqa.jsonl").read_text().splitlines()[0])
    lines = [hotpot, {**hotpot, "context": ""}]  # line 2: no context for prefilling to chunk
    (tmp_path / "empty_context.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    lines = [hotpot, {**hotpot, "context": " \n\t "}]  # line 2: whitespace only (generate refuses it too)
    (tmp_path / "blank_context.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    lines = [hotpot, {**hotpot, "input": "Why? " * 320}]  # line 2: a question of 1600 tokens
    (tmp_path / "long_question.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    os.mkfifo(tmp_path / "pipe.fifo")  # a named pipe nobody writes to (only stat-ed)
    return tmp_path
