"""``--sampling-top-p`` and ``--sampling-top-k``: the sampling filters of ``dllm.generate`` (``top_p``, ``top_k``) on
the command line, beside prefilling's ``--top-k`` (K, the chunks kept); Dream's demo settings need ``top_p``."""

import csv
import shlex

import pytest

import dllm
from dllm.cli.options import decode_kwargs
from dllm.cli.parser import build_parser
from tests.cli_files import run_cli


@pytest.mark.parametrize("cmd", [["generate"], ["eval", "needle"]])
def test_sampling_filters_reach_generate(cmd):
    parser = build_parser()
    args = parser.parse_args([*cmd, "--gen-length", "8", "--sampling-top-p", "0.95", "--sampling-top-k", "50"])
    kw = decode_kwargs(args, 8)
    assert (kw["top_p"], kw["top_k"]) == (0.95, 50)
    assert args.top_k is None  # prefilling's K is another option
    kw = decode_kwargs(parser.parse_args([*cmd, "--gen-length", "8"]), 8)
    assert (kw["top_p"], kw["top_k"]) == (None, None)  # off by default, as Dream's generation_config.json
    args = parser.parse_args([*cmd, "--gen-length", "8", "--top-k", "3", "--sampling-top-k", "7"])
    assert (args.top_k, decode_kwargs(args, 8)["top_k"]) == (3, 7)


BAD = {
    "top-p 0": ("--sampling-top-p 0", "argument --sampling-top-p: expected a number in (0, 1], got '0'"),
    "top-p above 1": ("--sampling-top-p 1.5", "expected a number in (0, 1], got '1.5'"),
    "top-p nan": ("--sampling-top-p nan", "expected a number in (0, 1], got 'nan'"),
    "top-p word": ("--sampling-top-p most", "expected a number in (0, 1], got 'most'"),
    "top-k 0": ("--sampling-top-k 0", "argument --sampling-top-k: expected an integer >= 1, got '0'"),
    "top-k fraction": ("--sampling-top-k 2.5", "argument --sampling-top-k: expected an integer >= 1, got '2.5'"),
}


@pytest.mark.parametrize("command", ["generate --prompt-file noslot.txt", "eval passkey"])
@pytest.mark.parametrize("name", BAD)
def test_bad_sampling_filters_are_one_error_line_before_the_model_loads(files, capsys, monkeypatch, command, name):
    flag, message = BAD[name]

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the error was found")

    monkeypatch.setattr(dllm, "load_model", no_load)
    rc, out, err = run_cli(capsys, *shlex.split(f"{command} {flag}"))
    assert rc == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err


def test_sampling_filter_errors_name_the_sampling_flags():
    """A filter value refused by the library (not by the parser) is named by its flag, not prefilling's --top-k."""
    from dllm.cli.options import as_flags

    assert as_flags(ValueError("top_k must be >= 1, got 0"), decoding=True) == "--sampling-top-k must be >= 1, got 0"
    assert as_flags(ValueError("top_p must be in (0, 1], got 2")) == "--sampling-top-p must be in (0, 1], got 2"
    assert as_flags(ValueError("top_k=9 exceeds")) == "--top-k=9 exceeds"  # a PrefillingConfig error


def _answer(capsys, extra):
    cmd = f"generate --prompt-file noslot.txt --gen-length 8 --alg maskgit_plus {extra}"
    rc, out, err = run_cli(capsys, *shlex.split(cmd))
    assert rc == 0, err
    return out


def test_sampling_filters_change_the_decoding(files, capsys):
    """Top-k 1 (or a top-p that keeps one token) at temperature 2 leaves the argmax only: the greedy answer, when
    positions are ranked by softmax(logits) as greedy ranks them; without a filter, temperature 2 samples."""
    greedy = _answer(capsys, "")
    sampled = "--temperature 2 --confidence-from logits"
    unfiltered = [_answer(capsys, f"{sampled} --seed {seed}") for seed in range(3)]
    assert any(out != greedy for out in unfiltered)
    for seed in range(3):
        assert _answer(capsys, f"{sampled} --seed {seed} --sampling-top-k 1") == greedy
        assert _answer(capsys, f"{sampled} --seed {seed} --sampling-top-p 1e-6") == greedy


def test_eval_rows_record_the_sampling_filters(files, capsys):
    base = "eval passkey --lengths 300 --depths 0.5 --samples 1 --gen-length 8"
    rc, _, err = run_cli(capsys, *shlex.split(f"{base} --out a.csv --sampling-top-p 0.95 --sampling-top-k 50"))
    assert rc == 0, err
    rc, _, err = run_cli(capsys, *shlex.split(f"{base} --out b.csv"))
    assert rc == 0, err
    rows = []
    for name in ("a.csv", "b.csv"):
        with open(files / name, newline="") as f:
            rows.append(next(csv.DictReader(f)))
    assert [(r["sampling_top_p"], r["sampling_top_k"]) for r in rows] == [("0.95", "50"), ("", "")]
