"""Command line: python -m dllm generate / eval on the bundled model; user errors; the --help examples."""

import argparse
import csv
import json
import re
import shlex
from pathlib import Path

import pytest

import dllm.evaluation
from dllm.cli import UserError, _strip_one_newline, build_parser, main

PROMPT = "There is a pass key hidden in the text below.\n\n{context}\n\nWhat is the pass key? The pass key is "
FILLER = "The grass is green. The sky is blue. "
TUNED = "--context-file doc.txt --method prefilling --chunk-size 256 --score-terms draft_contrast"  # as the demo


LONGBENCH_SAMPLE = Path(__file__).parent / "tasks" / "data" / "longbench_tiny.jsonl"


def write_example_files(folder):
    """The input files of the --help examples as the help describes them: prompt.txt (with the newline an
    editor adds), doc.txt, and hotpotqa.jsonl (the hotpotqa lines of the test suite's LongBench sample)."""
    (folder / "prompt.txt").write_text(PROMPT + "\n")
    (folder / "doc.txt").write_text(FILLER * 50 + "The pass key is 12345. Remember it. " + FILLER * 30)
    lines = [
        x for x in LONGBENCH_SAMPLE.read_text().splitlines() if x.strip() and json.loads(x)["dataset"] == "hotpotqa"
    ]
    assert lines
    (folder / "hotpotqa.jsonl").write_text("\n".join(lines * 2) + "\n")


@pytest.fixture()
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_example_files(tmp_path)
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "noslot.txt").write_text("What is the pass key? The pass key is ")
    return tmp_path


def run_cli(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_no_cuda_graph_gives_the_same_answer(files, capsys):
    cmd = "generate --prompt-file prompt.txt --context-file doc.txt --method prefilling --chunk-size 256 --gen-length 8"
    outs = [run_cli(capsys, *shlex.split(cmd + extra))[:2] for extra in ("", " --no-cuda-graph")]
    assert outs[0] == outs[1] and outs[0][0] == 0


@pytest.mark.parametrize("method", ["dense", "prefix_cache", "prefilling"])
def test_generate_prints_answer_and_stats(files, method, capsys):
    extra = " --chunk-size 256 --top-k 2" if method == "prefilling" else ""
    cmd = f"generate --prompt-file prompt.txt --context-file doc.txt --method {method} --gen-length 8 --steps 4{extra}"
    rc, out, err = run_cli(capsys, *shlex.split(cmd))
    assert rc == 0
    stats = json.loads(err.strip().splitlines()[-1])
    assert stats["steps"] == 4 and stats["nfe"] >= 4
    assert "total" in stats["seconds"]
    if method == "prefilling":
        assert len(stats["selected_chunks"]) == 2 and stats["num_chunks"] == 12  # 2996 characters / 256
        # the bundled model's prefilling_config.json scores with s_C - s_P: s_I is never computed, so not shown
        assert {"s_P", "s_C"} <= set(stats) and "s_I" not in stats
    assert out.endswith("\n")


def test_prompt_file_loses_one_trailing_newline(files, capsys):
    assert _strip_one_newline("a\n") == "a" and _strip_one_newline("a\r\n") == "a"
    assert _strip_one_newline("a\n\n") == "a\n" and _strip_one_newline("a") == "a"
    (files / "bare.txt").write_text(PROMPT)  # the same prompt without the editor's newline
    answers = []
    for prompt in ("prompt.txt", "bare.txt"):
        rc, out, _ = run_cli(capsys, *shlex.split(f"generate --prompt-file {prompt} {TUNED} --gen-length 8"))
        assert rc == 0
        answers.append(out)
    # with the newline kept the bundled model answered 5341 (the query would end in "is \n")
    assert answers[0] == answers[1] and "12345" in answers[0]


def test_default_top_k_above_the_chunk_count_keeps_every_chunk(files, capsys):
    # 2996 tokens at the default chunk size (1024) are 3 chunks, fewer than the default K of 4
    base = ["generate", "--prompt-file", "prompt.txt", "--context-file", "doc.txt", "--method", "prefilling"]
    rc, _, err = run_cli(capsys, *base, "--gen-length", "4", "--chunk-size", "1024")
    stats = json.loads(err.strip().splitlines()[-1])
    assert rc == 0 and stats["num_chunks"] == 3 and stats["selected_chunks"] == [0, 1, 2]
    assert "s_I" not in stats  # nothing was scored, so no score is reported
    rc, _, err = run_cli(capsys, *base, "--gen-length", "4", "--chunk-size", "256", "--top-k", "all")
    stats = json.loads(err.strip().splitlines()[-1])
    assert rc == 0 and stats["selected_chunks"] == list(range(12))


BAD_INPUTS = {  # name: (command line after "python -m dllm", what its error line says)
    "missing prompt file": ("generate --prompt-file nope.txt", "nope.txt': no such file"),
    "prompt path is a folder": ("generate --prompt-file .", "not a file"),
    "missing context file": ("generate --prompt-file prompt.txt --context-file x.txt", "no such file"),
    "missing model": ("generate --prompt-file prompt.txt --model nope", "no such directory"),
    "model folder without config": ("generate --prompt-file noslot.txt --model .", "config.json"),
    "empty context": ("generate --prompt-file prompt.txt --context-file empty.txt", "is empty"),
    "slot without context": ("generate --prompt-file prompt.txt", "no --context-file"),
    "context without slot": ("generate --prompt-file noslot.txt --context-file doc.txt", "exactly one {context} slot"),
    "top_k above the chunks": (
        "generate --prompt-file prompt.txt --context-file doc.txt --method prefilling --chunk-size 256 --top-k 13",
        "--top-k 13 exceeds the 12 chunk",
    ),
    "chunk size 0": ("eval passkey --method prefilling --chunk-size 0", "integer >= 1, got '0'"),
    "unknown score term": ("eval passkey --method prefilling --score-terms s_X", "invalid choice"),
    "token budget above the chunk size": (
        "eval passkey --method prefilling --chunk-size 64 --token-budget 65",
        "token_budget",
    ),
    "prefilling option with dense": ("eval passkey --top-k 2", "--top-k: option(s) of --method prefilling"),
    "graph option with dense": (
        "generate --prompt-file prompt.txt --context-file doc.txt --no-cuda-graph",
        "--no-cuda-graph: option(s) of --method prefilling",
    ),
    "top-k word": ("eval passkey --method prefilling --top-k most", "integer >= 1, got 'most'"),
    "gen length 0": ("eval passkey --gen-length 0", "integer >= 1"),
    "negative temperature": ("eval passkey --temperature -1", "number >= 0"),
    "threshold above 1": ("eval passkey --threshold 1.5", "threshold"),
    "block length without gen length": ("eval passkey --block-length 2", "needs --gen-length"),
    "block length not dividing": ("eval passkey --gen-length 8 --block-length 3", "does not divide"),
    "depth above 1": ("eval passkey --depths 1.5", "depth in [0, 1]"),
    "no samples": ("eval passkey --samples 0", "integer >= 1"),
    "unknown task": ("eval passkey2", "invalid choice"),
    "unknown dtype": ("eval passkey --dtype int8", "invalid choice"),
    "unknown device": ("eval passkey --device tpu", "not a device"),
    "unsupported device": ("eval passkey --device meta", "only cpu and cuda"),
    "out is a folder": ("eval passkey --out .", "is a directory"),
    "length too short for the needle": ("eval needle --lengths 8", "needle"),
    "longbench without data": ("eval longbench", "--data FILE.jsonl"),
    "missing longbench file": ("eval longbench --data nope.jsonl", "no such file"),
    "limit without longbench": ("eval passkey --limit 3", "--limit goes with the longbench task"),
    "longbench file that is not JSON": ("eval longbench --data prompt.txt", "not valid JSON"),
    "chat without a chat template": (
        "generate --prompt-file prompt.txt --context-file doc.txt --chat",
        "has no chat template",
    ),
    "info of a missing model": ("info --model nope", "no such directory"),
    "no command": ("", "required: COMMAND"),
}


@pytest.mark.parametrize("argv,message", list(BAD_INPUTS.values()), ids=list(BAD_INPUTS))
def test_user_errors_are_one_line_and_exit_2(files, capsys, argv, message):
    rc, out, err = run_cli(capsys, *shlex.split(argv))
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
    assert "Traceback" not in err and out == ""


def test_debug_shows_the_traceback(files):
    with pytest.raises(UserError, match="no --context-file"):
        main(["generate", "--prompt-file", "prompt.txt", "--debug"])
    with pytest.raises(ValueError, match="config.json"):
        main(["generate", "--prompt-file", "noslot.txt", "--model", ".", "--debug"])


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


def test_eval_writes_csv_rows_after_an_untimed_warm_up(tmp_path, monkeypatch, capsys):
    calls = []
    real = dllm.evaluation.run_case
    monkeypatch.setattr(dllm.evaluation, "run_case", lambda *a, **k: calls.append(a[1].seed) or real(*a, **k))
    out = tmp_path / "rows.csv"
    cmd = "eval passkey --lengths 300 --depths 0 1 --samples 1 --method prefilling --chunk-size 64 --top-k 2"
    rc, stdout, _ = run_cli(capsys, *shlex.split(cmd), "--gen-length", "8", "--out", str(out))
    assert rc == 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 2 and len(calls) == 3  # the first case once more, untimed, before the timed ones
    for key in ("task", "length", "depth", "method", "correct", "answer", "seconds", "nfe"):
        assert key in rows[0]
    assert {r["depth"] for r in rows} == {"0.0", "1.0"}
    assert all(len(r["selected_chunks"].split()) == 2 for r in rows)
    assert "accuracy %" in stdout and "one warm-up case" in stdout
