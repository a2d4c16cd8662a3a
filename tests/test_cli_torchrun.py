"""``torchrun ... python -m dllm generate``: one-rank gloo groups in this process, their notes and their selection
equal to the single-process run's."""

import json
import shlex

from tests.cli_files import cli_notes, run_cli, unencodable_note


def port() -> str:
    """A free local TCP port for a one-rank gloo group (MASTER_PORT)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def test_torchrun_window_note_is_json_under_stats_json(files, capsys, monkeypatch):
    """Under torchrun ``--stats json`` the past-the-window note is a JSON line, as in the one-process CLI (it was
    plain text). One gloo rank in this process, the environment torchrun
    sets; the same document and prompt as the test above."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", port())
    rc, _, err = run_cli(
        capsys, *shlex.split("encode --context-file doc.txt --out book.idx --device cpu --chunk-size 256")
    )
    assert rc == 0, err
    monkeypatch.setenv("MASTER_PORT", port())
    cmd = "generate --document book.idx --prompt-file prompt.txt --device cpu --top-k 4 --adaptive-k off"
    cmd += " --gen-length 600 --steps 1"
    rc, _, err = run_cli(capsys, *shlex.split(cmd + " --stats json"))
    assert rc == 0, err
    lines = [json.loads(line) for line in err.strip().splitlines()]  # main: a plain-text "note: ..." line
    notes = [d["note"] for d in lines if set(d) == {"note"}]
    assert notes and notes[0].startswith("prefix, kept chunks, query and --gen-length 600 reach position")


def test_torchrun_decodes_exactly_the_adaptive_selection(tmp_path, capsys, monkeypatch):
    """The root decoded its kept chunks with top_k=None and adaptive_k still set, which (since adaptive K
    applies at K = N) scored and cut them again: another answer and 2 more forwards than one
    process, under the same stats line. One gloo rank in this process (the environment torchrun sets) against
    the one-process CLI on the same cache settings: the same answer, kept chunks and forwards."""
    from dllm.eval.tasks import make_case

    monkeypatch.chdir(tmp_path)
    case = make_case("kv_retrieval", 4096, 0.3, 4)
    (tmp_path / "ctx.txt").write_text(case.context)
    (tmp_path / "prompt.txt").write_text(case.prefix + "{context}" + case.query)
    flags = "--prompt-file prompt.txt --device cpu --top-k 8 --adaptive-k 1.5 --lexical-weight 0 --candidates all"
    flags += " --gen-length 8 --stats json"
    rc, _, err = run_cli(capsys, *shlex.split("encode --context-file ctx.txt --out one.cache --chunk-size 128"))
    assert rc == 0, err
    rc, out_one, err = run_cli(capsys, *shlex.split(f"generate --document one.cache {flags}"))
    assert rc == 0, err
    one = json.loads(err.strip().splitlines()[-1])

    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_PORT", port())
    cmd = "encode --context-file ctx.txt --out doc.idx --device cpu --chunk-size 128"
    rc, _, err = run_cli(capsys, *shlex.split(cmd))
    assert rc == 0, err
    monkeypatch.setenv("MASTER_PORT", port())
    rc, out_dist, err = run_cli(capsys, *shlex.split(f"generate --document doc.idx {flags}"))
    assert rc == 0, err
    dist = json.loads(err.strip().splitlines()[-1])
    assert len(one["selected_chunks"]) >= 2  # a set that a second adaptive cut would shrink
    assert dist["selected_chunks"] == one["selected_chunks"] and out_dist == out_one
    assert dist["nfe"] == one["nfe"]


def test_torchrun_notes_unencodable_characters_once(files, capsys, monkeypatch):
    """torchrun's encode and generate gave no note on characters the tokenizer drops (one process did). One
    gloo rank in this process, the environment torchrun sets."""
    (files / "accent.txt").write_text((files / "doc.txt").read_text() + " Caf\u00e9.")
    (files / "tab.txt").write_text("Find the pass key.\t\n\n{context}\n\nWhat is the pass key? The pass key is ")
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_PORT", port())
    rc, notes, err = cli_notes(capsys, "encode --context-file accent.txt --out a.idx --device cpu")
    assert rc == 0 and notes == [unencodable_note("--context-file accent.txt", 1, "'\u00e9' (U+00E9) x1")], err
    monkeypatch.setenv("MASTER_PORT", port())
    cmd = "generate --document a.idx --prompt-file tab.txt --device cpu --gen-length 2 --steps 1"
    rc, notes, err = cli_notes(capsys, cmd)
    assert rc == 0 and notes == [unencodable_note("the prompt", 1, "'\\t' (U+0009) x1")], err
