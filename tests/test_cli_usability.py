"""The command line as a new user meets it: help with the chosen model's defaults,
questions from a file or stdin with labelled answers, the one-line stats summary, progress bars only on a
terminal, eval CSVs that never overwrite and carry provenance, characters per token in info."""

import csv
import io
import json
import os
import re
import shlex
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import dllm
import dllm.prefilling.chunks
from dllm.cli import build_parser, main
from dllm.cli.generate import _one_line_answer
from dllm.prefilling import PrefillingConfig, chunk_char_spans
from tests.cli_files import FILLER, PROMPT, cli_notes, run_cli, unencodable_note
from tests.tiny_checkpoints import DREAM_TOKENIZER, snapped_starts

ROOT = Path(__file__).resolve().parents[1]
ASK = PROMPT.replace("What is the pass key? ", "{question} ")  # prompt.txt with a {question} slot
QUESTIONS = ["What is the pass key?", "Which number is hidden in the text?", "What number should you remember?"]


def _subparser(name, model_dir=None):
    import argparse

    top = build_parser(model_dir)
    return next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices[name]


def _option_help(parser, flag) -> str:
    text = " ".join(parser.format_help().split())
    text = text[text.index("options:") :]  # past the usage lines
    return text[text.index(flag + " ") :][:400]


# ---------------------------------------------------------------- help


def test_help_shows_the_defaults_of_the_chosen_model(tmp_path, capsys, monkeypatch):
    """Bundled model: C=256 (its prefilling_config.json) beside the library's / paper's 1024; a checkpoint
    without the file: 1024 and nothing else; ``--model DIR --help`` resolves the model before printing."""
    for name in ("generate", "eval", "encode"):
        text = _option_help(_subparser(name), "--chunk-size CHUNK_SIZE")
        assert "default: 256, the bundled model's; the library's and the paper's: 1024" in text, (name, text)
    assert "default: draft_contrast, the bundled model's" in _option_help(_subparser("generate"), "--score-terms")
    assert "(default: 4, or every chunk" in _option_help(_subparser("generate"), "--top-k")
    for name in ("generate", "eval", "encode"):  # the snap that runs is the bundled file's, not 0
        text = _option_help(_subparser(name), "--boundary-snap BOUNDARY_SNAP")
        assert "default: 64, the bundled model's; the library's and the paper's: 0" in text, (name, text)
    monkeypatch.chdir(tmp_path)
    bare = Path("ckpt")  # relative: a long path would be wrapped inside the help text
    bare.mkdir()
    (bare / "config.json").write_text((ROOT / "dllm/assets/tiny-dream/config.json").read_text())
    with pytest.raises(SystemExit) as exit_:
        main(["generate", "--model", str(bare), "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert exit_.value.code == 0
    assert f"here {bare}" in out and "C, context tokens per chunk (default: 1024)" in out and "256" not in out
    with pytest.raises(SystemExit):  # --model=DIR, and --help before --model
        main(["eval", "--help", f"--model={bare}"])
    assert "C, context tokens per chunk (default: 1024)" in " ".join(capsys.readouterr().out.split())
    (bare / "prefilling_config.json").write_text(json.dumps({"chunk_size": 512, "top_k": 2}))
    text = " ".join(_subparser("generate", str(bare)).format_help().split())
    assert f"(default: 512, {bare}'s; the library's and the paper's: 1024)" in text
    assert f"(default: 2, {bare}'s; the library's and the paper's: 4, or every chunk" in text


def test_a_candidate_layer_without_candidates_in_the_checkpoint_is_one_error_line(files, capsys):
    """A prefilling_config.json with candidate_layer and no candidates ran the paper's selection
    (the layer of a first stage that does not run, silently ignored); now one error line naming the file."""
    bare = files / "ckpt"
    bare.mkdir()
    (bare / "config.json").write_text((ROOT / "dllm/assets/tiny-dream/config.json").read_text())
    (bare / "prefilling_config.json").write_text(json.dumps({"candidate_layer": 1}))
    rc, out, err = run_cli(
        capsys, "generate", "--model", str(bare), "--prompt-file", "prompt.txt", "--context-file", "doc.txt"
    )
    assert rc == 2 and out == ""
    assert err.strip().splitlines() == [
        f"error: {bare / 'prefilling_config.json'}: candidate_layer=1 needs candidates (the first stage it belongs "
        "to is off with candidates=None): give candidates too, or leave candidate_layer unset"
    ]


def test_off_overrides_a_checkpoint_adaptive_k_and_redundancy_threshold(tmp_path, monkeypatch):
    """The harness could turn off a checkpoint's adaptive_k or redundancy_threshold (None); the CLI had no word
    for it (a margin must be > 0): ``off`` now, and the help shows the checkpoint's value."""
    from dllm.cli.errors import UserError
    from dllm.cli.options import prefilling_config

    monkeypatch.chdir(tmp_path)
    ckpt = Path("ckpt")
    ckpt.mkdir()
    (ckpt / "config.json").write_text((ROOT / "dllm/assets/tiny-dream/config.json").read_text())
    (ckpt / "prefilling_config.json").write_text(json.dumps({"adaptive_k": 1.5, "redundancy_threshold": 0.8}))
    Path("p.txt").write_text("Q?")
    parser = _subparser("generate", str(ckpt))
    text = " ".join(parser.format_help().split())
    assert f"(default: 1.5, {ckpt}'s; the library's and the paper's: off)" in text
    assert f"(default: 0.8, {ckpt}'s; the library's and the paper's: off)" in text

    def config(*flags):
        argv = ["--prompt-file", "p.txt", "--model", str(ckpt), "--device", "cpu", "--method", "prefilling", *flags]
        args = parser.parse_args(argv)
        return prefilling_config(args, str(ckpt))

    cfg = config()
    assert (cfg.adaptive_k, cfg.redundancy_threshold) == (1.5, 0.8)
    cfg = config("--adaptive-k", "off", "--redundancy-threshold", "OFF")
    assert (cfg.adaptive_k, cfg.redundancy_threshold) == (None, None)
    cfg = config("--adaptive-k", "2")
    assert (cfg.adaptive_k, cfg.redundancy_threshold) == (2.0, 0.8)
    with pytest.raises(UserError, match="argument --adaptive-k: expected a finite number > 0, got 'of', or off"):
        parser.parse_args(["--prompt-file", "p.txt", "--adaptive-k", "of"])


def test_help_marks_the_research_options():
    help_text = _subparser("generate").format_help()
    research = help_text[help_text.index("research options of prefilling") : help_text.index("examples:")]
    product = help_text[: help_text.index("research options of prefilling")]
    for flag in ("--token-budget", "--position-mode", "--cache-mode", "--score-mode", "--score-terms"):
        assert flag + " " in research and f"  {flag} " not in product, flag
    for flag in ("--chunk-size", "--top-k", "--prefill-batch"):
        assert f"  {flag} " in product and f"  {flag} " not in research, flag
    assert "research option: the distribution that ranks positions" in " ".join(help_text.split())


# ---------------------------------------------------------------- questions


@pytest.fixture()
def asked(files):
    (files / "ask.txt").write_text(ASK + "\n")
    (files / "questions.txt").write_text("\n".join([QUESTIONS[0], "", QUESTIONS[1] + "\r", "   ", QUESTIONS[2]]) + "\n")
    return files


def _count_chunk_encodings(monkeypatch) -> list:
    """Every chunked prefill goes through encode_chunks_rows (fresh prompts and encode_document alike)."""
    calls = []
    real = dllm.prefilling.chunks.encode_chunks_rows

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(dllm.prefilling.chunks, "encode_chunks_rows", counting)
    return calls


def test_questions_file_answers_each_from_one_load_and_one_encoding(asked, capsys, monkeypatch):
    """Blank lines skipped, CRLF lines accepted; answers labelled and equal to one fresh run per question."""
    fresh = []
    for q in QUESTIONS:
        rc, out, _ = run_cli(capsys, *shlex.split("generate --prompt-file ask.txt --context-file doc.txt"),
                             "--question", q, "--gen-length", "8")  # fmt: skip
        assert rc == 0 and out.splitlines()[0] == f"Q1: {q}"
        fresh.append(out.splitlines()[1].removeprefix("A1: "))
    assert "12345" in fresh[0]
    loads, encodings = [], _count_chunk_encodings(monkeypatch)
    real_load = dllm.load_model
    monkeypatch.setattr(dllm, "load_model", lambda *a, **k: loads.append(1) or real_load(*a, **k))
    cmd = "generate --prompt-file ask.txt --context-file doc.txt --questions-file questions.txt --gen-length 8"
    rc, out, err = run_cli(capsys, *shlex.split(cmd))
    assert rc == 0, err
    want = [line for i, (q, a) in enumerate(zip(QUESTIONS, fresh), 1) for line in (f"Q{i}: {q}", f"A{i}: {a}")]
    assert out.splitlines() == want
    assert loads == [1] and encodings == [1]
    n = len(snapped_starts((asked / "doc.txt").read_text(), 256, 64))  # the bundled C=256, snapped within 64
    assert f"encoded the context once for every question: 2996 tokens in {n} chunks" in err
    # --question comes first, then the file's lines
    rc, out, _ = run_cli(capsys, *shlex.split(cmd), "--question", "Where is the pass key?")
    assert (
        rc == 0
        and out.splitlines()[0] == "Q1: Where is the pass key?"
        and out.splitlines()[2] == want[0].replace("Q1", "Q2")
    )


def test_questions_from_stdin(asked, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("\n".join(QUESTIONS[:2]).encode())))
    cmd = "generate --prompt-file ask.txt --context-file doc.txt --questions-file - --gen-length 8 --stats none"
    rc, out, err = run_cli(capsys, *shlex.split(cmd))
    assert rc == 0 and err == ""
    assert [x.split(": ")[0] for x in out.splitlines()] == ["Q1", "A1", "Q2", "A2"] and "12345" in out.splitlines()[1]


def test_a_byte_order_mark_is_not_part_of_the_first_question(asked, capsys, monkeypatch):
    """A questions file saved with a UTF-8 BOM (from a file or stdin) asks the same first
    question as one without, as the JSON reader skips it."""
    cmd = "generate --prompt-file ask.txt --context-file doc.txt --gen-length 4 --stats none --questions-file"
    (asked / "q.txt").write_text(QUESTIONS[0] + "\n")
    (asked / "bom.txt").write_bytes(b"\xef\xbb\xbf" + (QUESTIONS[0] + "\n").encode())
    plain = run_cli(capsys, *shlex.split(cmd), "q.txt")
    assert plain[0] == 0 and plain[1].splitlines()[0] == f"Q1: {QUESTIONS[0]}"
    assert run_cli(capsys, *shlex.split(cmd), "bom.txt") == plain
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO((asked / "bom.txt").read_bytes())))
    assert run_cli(capsys, *shlex.split(cmd), "-") == plain


def test_labelled_answers_stay_on_one_line():
    assert _one_line_answer("a\nb\r\nc\\n") == "a\\nb\\r\\nc\\\\n"
    assert _one_line_answer("12345") == "12345"


QUESTION_ERRORS = {
    "prompt without a question slot": (
        "generate --prompt-file prompt.txt --context-file doc.txt --question x",
        "must hold exactly one {question} slot for the questions, found 0",
    ),
    "prompt with two question slots": (
        "generate --prompt-file two.txt --context-file doc.txt --question x",
        "found 2",
    ),
    "questions file without questions": (
        "generate --prompt-file ask.txt --context-file doc.txt --questions-file blank.txt",
        "--questions-file blank.txt: no questions",
    ),
    "missing questions file": ("generate --prompt-file ask.txt --questions-file nope.txt", "no such file"),
    "question holding a slot": (
        "generate --prompt-file ask.txt --context-file doc.txt --question '{context}'",
        "question 1 holds a {context} or {question} slot",
    ),
    "no prompt and no question": ("generate --context-file doc.txt", "needs --prompt-file, --question or"),
    "question slot without a question": (  # the literal "{question}" was decoded
        "generate --prompt-file ask.txt --context-file doc.txt",
        "--prompt-file ask.txt holds a {question} slot but no question was given",
    ),
    "unknown stats mode": ("generate --prompt-file prompt.txt --stats yaml", "invalid choice: 'yaml'"),
    # one message for every bad margin: 0 and -0 were told "expected a finite number >= 0" elsewhere
    **{
        f"adaptive margin {bad}": (
            f"generate --prompt-file prompt.txt --adaptive-k {bad}",
            f"argument --adaptive-k: expected a finite number > 0, got '{bad}'",
        )
        for bad in ("0", "-0", "-1", "abc", "nan", "inf")
    },
}


@pytest.mark.parametrize("argv,message", list(QUESTION_ERRORS.values()), ids=list(QUESTION_ERRORS))
def test_question_errors_are_one_line_before_the_model_loads(asked, capsys, monkeypatch, argv, message):
    (asked / "two.txt").write_text("{context} {question} {question}")
    (asked / "blank.txt").write_text("\n  \n\r\n")
    monkeypatch.setattr(dllm, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    rc, out, err = run_cli(capsys, *shlex.split(argv))
    lines = err.strip().splitlines()
    assert rc == 2 and out == "" and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err


def test_default_prompt_with_questions_is_context_then_question(files, capsys):
    """Without --prompt-file the prompt is {context}{question}: the same answer as that prompt file."""
    (files / "cq.txt").write_text("{context}{question}")
    q = "What is the pass key? The pass key is "
    a = run_cli(capsys, "generate", "--context-file", "doc.txt", "--question", q, "--gen-length", "6")
    b = run_cli(capsys, "generate", "--prompt-file", "cq.txt", "--context-file", "doc.txt", "--question", q,
                "--gen-length", "6")  # fmt: skip
    assert a[0] == b[0] == 0 and a[1] == b[1] and a[1].startswith("Q1: What is the pass key? The pass key is\nA1:")


# ---------------------------------------------------------------- stats and progress


def test_stats_summary_is_one_line_with_the_kept_chunks_character_spans(files, capsys):
    rc, out, err = run_cli(
        capsys,
        # a fixed K of 4 (the bundled file's K is adaptive): four spans to check
        *shlex.split(
            "generate --prompt-file prompt.txt --context-file doc.txt --gen-length 8 --boundary-snap 0 --adaptive-k off"
        ),
    )
    assert rc == 0 and "12345" in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stats: kept 4 of 12 chunks of 256 tokens: "), err
    assert "\r" not in err and "step/s" not in err  # no progress bar when stderr is not a terminal
    spans = [(int(j), int(s), int(e)) for j, s, e in re.findall(r"(\d+) \[chars (\d+):(\d+)\]", lines[0])]
    # the bundled tokenizer is character-level: chunk j covers characters [256 j, 256 (j + 1)) of 2996
    assert len(spans) == 4 and all((s, e) == (256 * j, min(256 * (j + 1), 2996)) for j, s, e in spans)
    for phase in ("prefill", "scoring", "decode", "total"):
        assert re.search(rf"\b{phase} \d+\.\d\d s\b", lines[0]), phase
    assert re.search(r"; 8 steps, \d+ forwards, [\d.]+ tokens/s$", lines[0])
    cmd = "generate --prompt-file prompt.txt --context-file doc.txt --gen-length 8 --stats json --boundary-snap 0"
    rc, _, err = run_cli(capsys, *shlex.split(cmd + " --adaptive-k off"))
    stats = json.loads(err)
    assert stats["selected_chunk_chars"] == [[s, e] for _, s, e in spans]
    rc, _, err = run_cli(capsys, *shlex.split("generate --prompt-file noslot.txt --gen-length 2"))
    assert rc == 0 and re.fullmatch(
        r"stats: decode \d+\.\d\d s, total \d+\.\d\d s; 2 steps, 2 forwards, [\d.]+ tokens/s\n", err
    )


def test_character_spans_with_a_bpe_tokenizer():
    """Dream's byte-level BPE: each chunk's span is the text its tokens decode to, and the spans tile the text."""
    if not os.path.isdir(DREAM_TOKENIZER):
        pytest.skip("the vendored Dream tokenizer is missing")
    from dllm.model.loader import load_tokenizer

    tok = load_tokenizer(DREAM_TOKENIZER, family="dream")
    fake = types.SimpleNamespace(tokenizer=tok, device=torch.device("cpu"))
    text = FILLER * 20 + "The pass key is 12345. Remember it. " + FILLER * 10
    ids = tok(text, add_special_tokens=False)["input_ids"]
    spans = chunk_char_spans(fake, text, PrefillingConfig(chunk_size=16))
    assert len(spans) == -(-len(ids) // 16) and spans[0][0] == 0 and spans[-1][1] == len(text)
    for j, (s, e) in enumerate(spans):
        assert tok.decode(ids[16 * j : 16 * (j + 1)]) == text[s:e]
        assert j == 0 or s == spans[j - 1][1]


def test_progress_bars_on_a_terminal_only(files, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    rc, _, err = run_cli(
        capsys, *shlex.split("generate --prompt-file prompt.txt --context-file doc.txt --gen-length 4")
    )
    assert rc == 0 and "denoising" in err and "chunked prefill" in err


# ---------------------------------------------------------------- eval CSV


def test_eval_csv_names_are_unique_and_rows_carry_provenance_and_settings(files, capsys):
    from dllm.eval.provenance import git_commit

    cmd = "eval passkey --lengths 300 --depths 0.5 --samples 1 --gen-length 8"
    written = []
    for _ in range(2):
        rc, out, _ = run_cli(capsys, *shlex.split(cmd))
        assert rc == 0
        written.append(re.search(r"wrote (\S+)", out).group(1))
    assert written[0] != written[1] and all(re.fullmatch(r"runs/eval_passkey_prefilling_\d{8}-\d{6}(-\d+)?\.csv", w)
                                            for w in written)  # fmt: skip
    assert all((files / w).is_file() for w in written)
    import triton

    row = next(csv.DictReader((files / written[1]).open()))
    assert (row["device"], row["device_kind"].split(" ")[0], row["torch"], row["triton"]) == (
        "cpu", "CPU", torch.__version__, triton.__version__,
    )  # fmt: skip
    assert row["commit"] == git_commit() and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", row["date_utc"])
    assert (row["chunk_size"], row["top_k"], row["token_budget"], row["score_terms"]) == ("256", "4", "all",
                                                                                          "draft_contrast")  # fmt: skip
    assert (row["model"], row["dtype"], row["gen_length"], row["method"]) == ("bundled tiny-dream", "float32", "8",
                                                                              "prefilling")  # fmt: skip
    rc, _, _ = run_cli(capsys, *shlex.split(cmd + " --method dense --out dense.csv"))
    row = next(csv.DictReader((files / "dense.csv").open()))
    assert rc == 0 and row["chunk_size"] == row["top_k"] == "" and row["method"] == "dense"


def test_eval_csv_carries_every_prefilling_setting_it_ran_with(files, capsys):
    """The boundary snap, redundancy threshold and candidates (and every other field of
    PrefillingConfig) are columns; None is written as what it means."""
    import dataclasses

    cmd = "eval passkey --lengths 300 --depths 0.5 --samples 1 --gen-length 8 --chunk-size 64 --top-k 2"
    rc, _, err = run_cli(capsys, *shlex.split(cmd), "--boundary-snap", "8", "--redundancy-threshold", "0.5",
                         "--candidates", "3", "--out", "snap.csv")  # fmt: skip
    assert rc == 0, err
    row = next(csv.DictReader((files / "snap.csv").open()))
    assert [f.name for f in dataclasses.fields(PrefillingConfig) if f.name not in row] == []
    assert (row["boundary_snap"], row["redundancy_threshold"], row["candidates"]) == ("8", "0.5", "3")
    assert (row["chunk_size"], row["top_k"], row["candidate_layer"], row["prefill_batch"]) == ("64", "2", "0", "auto")
    rc, _, _ = run_cli(capsys, *shlex.split(cmd), "--out", "plain.csv")  # the checkpoint's snap, carried to C=64
    row = next(csv.DictReader((files / "plain.csv").open()))
    assert rc == 0 and (row["boundary_snap"], row["redundancy_threshold"], row["candidates"]) == ("16", "off", "auto")
    rc, _, _ = run_cli(capsys, *shlex.split(cmd), "--candidates", "all", "--out", "every.csv")  # the paper's
    assert rc == 0 and next(csv.DictReader((files / "every.csv").open()))["candidates"] == "off"


def test_git_commit_never_fails(tmp_path, monkeypatch):
    from dllm.eval.provenance import git_commit

    monkeypatch.delenv("GIT_COMMIT", raising=False)
    assert git_commit(tmp_path) == "unknown"  # an installed package: no checkout beside it
    monkeypatch.setenv("GIT_COMMIT", "abc123")
    assert git_commit(tmp_path) == "abc123"
    (tmp_path / ".git").write_text("gitdir: /nonexistent\n")  # a broken checkout: git fails, no exception
    assert git_commit(tmp_path) == "abc123"
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode == 0:
        assert git_commit().split("-")[0] == head.stdout.strip()


# ---------------------------------------------------------------- info


def test_info_says_how_many_characters_a_token_covers(capsys):
    from dllm.cli.info import TEXT_SAMPLE, chars_per_token

    text = Path(TEXT_SAMPLE).read_text(encoding="utf-8")
    rc, out, _ = run_cli(capsys, "info")
    # the bundled tokenizer is character-level: one token per character
    line = next(x for x in out.splitlines() if x.startswith("characters / token:"))
    assert rc == 0 and f"1.00 on dllm/assets/english_sample.txt, English prose ({len(text):,} characters, " in line
    rc, out, _ = run_cli(capsys, "info", "--json")
    tok = json.loads(out)["tokenizer"]
    assert (tok["chars_per_token"], tok["characters"], tok["tokens"]) == (1.0, len(text), len(text))
    if os.path.isdir(DREAM_TOKENIZER):  # Qwen2's BPE (Dream's): several characters a token on English prose
        from dllm.model.loader import load_tokenizer

        dream = load_tokenizer(DREAM_TOKENIZER, family="dream")
        got = chars_per_token(dream)
        n = len(dream.encode(text, add_special_tokens=False))
        assert (
            got["tokens"] == n and got["chars_per_token"] == round(len(text) / n, 3) and 4 < got["chars_per_token"] < 6
        )


def test_stats_summary_from_a_document_gives_token_spans(files, capsys):
    """A document cache holds token ids, not the text: its kept chunks are given as token spans [start:end)."""
    assert run_cli(capsys, *shlex.split("encode --context-file doc.txt --out doc.cache --boundary-snap 0"))[0] == 0
    cmd = "generate --document doc.cache --prompt-file prompt.txt --gen-length 8 --adaptive-k off --stats"  # K=4
    rc, out, err = run_cli(capsys, *shlex.split(cmd + " summary"))
    assert rc == 0 and "12345" in out
    spans = [(int(j), int(s), int(e)) for j, s, e in re.findall(r"(\d+) \[tokens (\d+):(\d+)\]", err)]
    assert len(spans) == 4 and all((s, e) == (256 * j, min(256 * (j + 1), 2996)) for j, s, e in spans)
    rc, _, err = run_cli(capsys, *shlex.split(cmd + " json"))
    assert json.loads(err)["selected_chunk_tokens"] == [[s, e] for _, s, e in spans]


def test_character_spans_follow_snapped_boundaries():
    """With boundary_snap the spans are the snapped chunks' text (each ends at a sentence end here), not
    fixed C-token cuts; on the bundled character-level tokenizer a span is the chunk's characters."""
    from dllm.prefilling.chunks import chunk_spans

    model = dllm.load_model()
    text = "Short one. " * 40
    cfg = PrefillingConfig(chunk_size=64, boundary_snap=16)
    spans = chunk_char_spans(model, text, cfg)
    cuts = chunk_spans(model, dllm.encode_text(model, text), 64, 16)
    assert [e - s for s, e in spans] == [n for _, n in cuts]  # one character per token
    assert all(text[e - 1] in ". " for s, e in spans[:-1]) and spans[-1][1] == len(text)
    assert spans != [(s, s + 64) for s in range(0, len(text), 64)]


def test_stats_json_keeps_every_stderr_line_json_with_many_questions(asked, capsys):
    cmd = "generate --prompt-file ask.txt --context-file doc.txt --questions-file questions.txt --gen-length 4"
    rc, _, err = run_cli(capsys, *shlex.split(cmd), "--stats", "json")
    lines = [json.loads(line) for line in err.strip().splitlines()]  # raises on a plain-text line
    assert rc == 0 and lines[0]["context_encoded_once"]["chunks"] >= 1
    assert [d.get("question") for d in lines[1:]] == [1, 2, 3]


def test_eval_names_are_reserved_so_runs_in_the_same_second_do_not_share_a_file(files, monkeypatch):
    """Two runs that pick their names in one second get two files (the first reserves its name at once); a run
    that fails before writing leaves no empty file behind."""
    import datetime as dt

    import dllm.cli.eval as cli

    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return dt.datetime(2026, 12, 2, 3, 4, 5, tzinfo=tz)

    monkeypatch.setattr(dt, "datetime", Frozen)
    first, second = cli._unique_eval_path("passkey", "dense"), cli._unique_eval_path("passkey", "dense")
    assert first.endswith("eval_passkey_dense_20261202-030405.csv") and second.endswith("-030405-2.csv")
    assert os.path.getsize(first) == os.path.getsize(second) == 0
    os.remove(first), os.remove(second)
    monkeypatch.setattr(cli, "_eval", lambda *a: (_ for _ in ()).throw(cli.UserError("no such thing")))
    rc = main(shlex.split("eval passkey --lengths 300 --depths 0.5 --samples 1"))
    assert rc == 2 and not list((files / "runs").glob("eval_*.csv"))


def test_encode_with_a_small_chunk_size_carries_the_snap_as_a_share_of_the_chunk(files, capsys):
    """The bundled defaults snap within 64 of 256 tokens; --chunk-size 64 alone snaps within 16 (not an error
    about a tolerance the user never set)."""
    rc, out, err = run_cli(capsys, *shlex.split("encode --context-file doc.txt --out d.cache --chunk-size 64"))
    assert rc == 0, err
    n = len(snapped_starts((files / "doc.txt").read_text(), 64, 16))
    assert f" in {n} chunks of 64 " in out and n > -(-2996 // 64)


def test_character_spans_skip_characters_the_tokenizer_drops():
    """The bundled character-level tokenizer has no token for 'ó', '’' or '—' and drops them (its offset
    mapping then drifts): each chunk's span still holds exactly the chunk's characters, with the dropped
    ones inside it, and spans follow each other."""
    model = dllm.load_model()
    text = "Krak\u00f3w\u2019s port \u2014 a quay. Caf\u00e9 open. " * 12
    ids = dllm.encode_text(model, text)
    kept = [c for c in text if c.isascii()]
    assert ids.numel() == len(kept)  # one token per ASCII character, the rest dropped
    spans = chunk_char_spans(model, text, PrefillingConfig(chunk_size=16))
    assert len(spans) == -(-len(kept) // 16)
    for j, (s, e) in enumerate(spans):
        assert "".join(c for c in text[s:e] if c.isascii()) == "".join(kept[16 * j : 16 * (j + 1)])
        assert text[s].isascii() and text[e - 1].isascii()  # a span starts and ends on a kept character
        assert j == 0 or s >= spans[j - 1][1]
    assert spans[-1][1] == len(text) - (not text[-1].isascii())
    # one dropped character early and whitespace at the end (the drift hid there): the chunk holding the key
    # starts on the key's first digit, not one character before it
    text = "Caf\u00e9 notes. " + "The pass key is 71432. Remember it. " * 12 + "\n\n"
    ids = dllm.encode_text(model, text)
    from dllm.model.tokenization import token_offsets

    offsets = token_offsets(model, text).tolist()
    pieces = [model.tokenizer.decode([i]) for i in ids.tolist()]
    assert [text[s:e] for s, e in offsets] == pieces and offsets[4] == [5, 6]  # 'é' (index 4) dropped


def test_character_spans_with_a_bpe_tokenizer_and_non_ascii_text():
    """Dream's byte-level BPE covers every character, so its own offsets are kept: spans tile the text."""
    if not os.path.isdir(DREAM_TOKENIZER):
        pytest.skip("the vendored Dream tokenizer is missing")
    from dllm.model.loader import load_tokenizer

    tok = load_tokenizer(DREAM_TOKENIZER, family="dream")
    fake = types.SimpleNamespace(tokenizer=tok, device=torch.device("cpu"))
    text = "Krak\u00f3w\u2019s port \u2014 a quay. Caf\u00e9 open \U0001f600. " * 12
    ids = tok(text, add_special_tokens=False)["input_ids"]
    spans = chunk_char_spans(fake, text, PrefillingConfig(chunk_size=16))
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    for j, (s, e) in enumerate(spans):
        assert j == 0 or s == spans[j - 1][1]
        assert tok.decode(ids[16 * j : 16 * (j + 1)]) in text[s:e]


def test_unencodable_characters_of_the_bundled_and_a_bpe_tokenizer():
    """The bundled tokenizer knows printable ASCII and newline: a tab, 'á', '€' and an emoji are dropped (a new
    user's 'á' x20 vanished without a word); Dream's byte-level BPE encodes every character."""
    from dllm.model.tokenization import encode_text, unencodable_characters

    model = dllm.load_model()
    text = "Caf\u00e9 \u00e1 \u00e1\tpays \u20ac100 \U0001f600.\nOK"
    got = unencodable_characters(model, text)
    assert got == {"\u00e9": 1, "\u00e1": 2, "\t": 1, "\u20ac": 1, "\U0001f600": 1}
    # the independent reference: what encode_text really leaves out, character by character
    assert len(encode_text(model, text)) == len(text) - sum(got.values())
    assert unencodable_characters(model, "plain ASCII text.\n") == {}
    if os.path.isdir(DREAM_TOKENIZER):
        from dllm.model.loader import load_tokenizer

        fake = types.SimpleNamespace(tokenizer=load_tokenizer(DREAM_TOKENIZER, family="dream"))
        assert unencodable_characters(fake, text) == {}


def test_dropped_characters_get_one_note(files, capsys):
    (files / "accents.txt").write_text((files / "doc.txt").read_text() + " Caf\u00e9 \u00e1\u00e1.")
    cmd = "generate --prompt-file prompt.txt --context-file accents.txt --gen-length 4 --steps 2"
    rc, notes, err = cli_notes(capsys, cmd)
    assert rc == 0 and notes == [
        unencodable_note("--context-file accents.txt", 3, "'\u00e9' (U+00E9) x1, '\u00e1' (U+00E1) x2")
    ], err
    rc, out, err = run_cli(capsys, *shlex.split(cmd.replace("accents.txt", "doc.txt")))
    assert rc == 0 and "cannot encode" not in err


def test_the_prompt_is_counted_once_and_the_questions_apart(files, capsys):
    """A tab in the prompt file was counted once per question (x3 for three questions)."""
    (files / "tab.txt").write_text("There is a pass key.\t\n\n{context}\n\n{question} The pass key is ")
    (files / "q3.txt").write_text("What is the pass key?\nWhich number?\nWhat is the key\u00e9?\n")
    cmd = "generate --prompt-file tab.txt --context-file doc.txt --questions-file q3.txt --gen-length 2 --steps 1"
    rc, notes, err = cli_notes(capsys, cmd)
    assert rc == 0 and notes == [
        unencodable_note("the prompt", 1, "'\\t' (U+0009) x1"),
        unencodable_note("the questions", 1, "'\u00e9' (U+00E9) x1"),
    ], err


def test_a_question_that_is_not_utf8_is_one_error_line(files, capsys):
    """Bytes that are not UTF-8 reach argv as lone surrogates; the tokenizer raised a TypeError traceback."""
    rc, out, err = run_cli(capsys, "generate", "--context-file", "doc.txt", "--question", "What is it\udcff?")
    assert rc == 2 and err.strip().splitlines() == ["error: --question #1 is not UTF-8 text"], err
    from dllm.model.tokenization import unencodable_characters

    assert unencodable_characters(dllm.load_model(), "a\ud800b") == {"\ud800": 1}


def test_eval_note_with_adaptive_k_on_short_contexts(files, capsys):
    """The note said short contexts 'keep every chunk' while adaptive K cut them."""
    cmd = "eval passkey --lengths 600 --samples 1 --depths 0.5 --adaptive-k 1.5 --gen-length 6 --out e.csv"
    rc, out, err = run_cli(capsys, *shlex.split(cmd))
    assert rc == 0, err
    assert (
        "have fewer than the default top_k=4 chunks of 256 tokens: adaptive K chooses among all of their chunks" in err
    )
    rows = list(csv.DictReader(open("e.csv")))
    assert len(rows) == 1 and 1 <= len(rows[0]["selected_chunks"].split()) < 3  # 3 chunks, cut below
