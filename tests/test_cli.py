"""Command line: python -m dllm generate / eval on the bundled model."""

import csv
import json

import pytest

from dllm.cli import main


@pytest.fixture()
def prompt_files(tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Find the pass key.\n\n{context}\n\nWhat is the pass key? The pass key is ")
    context = tmp_path / "context.txt"
    context.write_text("The grass is green. " * 30 + "The pass key is 42917. Remember it. " + "The sky is blue. " * 30)
    return str(prompt), str(context)


@pytest.mark.parametrize("method", ["dense", "prefix_cache", "prefilling"])
def test_generate_prints_answer_and_stats(prompt_files, method, capsys):
    prompt, context = prompt_files
    extra = ["--chunk-size", "128", "--top-k", "2"] if method == "prefilling" else []
    rc = main(
        [
            "generate",
            "--prompt-file",
            prompt,
            "--context-file",
            context,
            "--method",
            method,
            "--gen-length",
            "8",
            "--steps",
            "4",
            *extra,
        ]
    )
    assert rc == 0
    out, err = capsys.readouterr()
    stats = json.loads(err.strip().splitlines()[-1])
    assert stats["steps"] == 4 and stats["nfe"] >= 4
    assert "total" in stats["seconds"]
    if method == "prefilling":
        assert len(stats["selected_chunks"]) == 2 and stats["num_chunks"] >= 3
    assert out.endswith("\n")


def test_generate_slot_without_context_is_an_error(prompt_files):
    prompt, _ = prompt_files
    with pytest.raises(ValueError, match="no context was given"):
        main(["generate", "--prompt-file", prompt, "--method", "prefilling", "--gen-length", "4"])


def test_eval_writes_csv_rows(tmp_path, capsys):
    out = tmp_path / "rows.csv"
    rc = main(
        [
            "eval",
            "passkey",
            "--lengths",
            "300",
            "--depths",
            "0",
            "1",
            "--samples",
            "1",
            "--method",
            "prefilling",
            "--chunk-size",
            "64",
            "--top-k",
            "2",
            "--gen-length",
            "8",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 2
    for key in ("task", "length", "depth", "method", "correct", "answer", "seconds", "nfe"):
        assert key in rows[0]
    assert {r["depth"] for r in rows} == {"0.0", "1.0"}
    assert "accuracy %" in capsys.readouterr().out
