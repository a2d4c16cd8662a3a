"""Command line: python -m dllm generate / eval on the bundled model; user errors; the --help examples."""

import csv
import json
import os
import shlex
import threading

import pytest
import torch

import dllm.eval.evaluation
from dllm.cli import build_parser, main
from dllm.cli.errors import UserError
from dllm.cli.files import strip_one_newline as _strip_one_newline
from dllm.prefilling import PrefillingConfig
from tests.cli_files import FILLER, PROMPT, run_cli
from tests.tiny_checkpoints import snapped_starts

TUNED = "--context-file doc.txt --method prefilling --chunk-size 256 --score-terms draft_contrast"  # as the demo


def test_eval_refuses_an_out_that_links_to_its_data(files, capsys):
    before = (files / "hotpotqa.jsonl").read_bytes()
    (files / "results.csv").symlink_to(files / "hotpotqa.jsonl")
    rc, out, err = run_cli(capsys, *shlex.split("eval longbench --data hotpotqa.jsonl --out results.csv"))
    assert rc == 2 and "--out results.csv is the --data" in err and out == ""
    assert (files / "hotpotqa.jsonl").read_bytes() == before


def test_no_cuda_graph_gives_the_same_answer(files, capsys):
    cmd = "generate --prompt-file prompt.txt --context-file doc.txt --method prefilling --chunk-size 256 --gen-length 8"
    outs = [run_cli(capsys, *shlex.split(cmd + extra))[:2] for extra in ("", " --no-cuda-graph")]
    assert outs[0] == outs[1] and outs[0][0] == 0


@pytest.mark.parametrize("method", ["dense", "prefix_cache", "prefilling"])
def test_generate_prints_answer_and_stats(files, method, capsys):
    extra = " --chunk-size 256 --top-k 2 --adaptive-k off --boundary-snap 0" if method == "prefilling" else ""
    cmd = f"generate --prompt-file prompt.txt --context-file doc.txt --method {method} --gen-length 8 --steps 4{extra}"
    cmd += " --stats json"
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


def test_method_defaults_to_prefilling_with_a_context(files, capsys):
    """A long --context-file without --method gets the product (prefilling), not the slow dense baseline;
    a prompt alone decodes densely; eval cases always have a context."""
    rc, out, err = run_cli(
        capsys, *shlex.split("generate --prompt-file prompt.txt --context-file doc.txt --gen-length 8 --stats json")
    )
    stats = json.loads(err.strip().splitlines()[-1])
    # the bundled C=256, boundaries snapped to sentence ends within 64 characters (one token each), adaptive K
    # under a ceiling of 4: the needle's chunk and as many others as stand out
    starts = snapped_starts((files / "doc.txt").read_text(), 256, 64)
    needle = max(j for j, s in enumerate(starts) if s <= (files / "doc.txt").read_text().index("The pass key is"))
    n = len(starts)
    assert rc == 0 and stats["num_chunks"] == n > 12 and 1 <= len(stats["selected_chunks"]) <= 4
    assert needle in stats["selected_chunks"]
    assert "12345" in out
    rc, _, err = run_cli(capsys, *shlex.split("generate --prompt-file noslot.txt --gen-length 2 --stats json"))
    assert rc == 0 and "selected_chunks" not in json.loads(err.strip().splitlines()[-1])
    cmd = "eval passkey --lengths 300 --depths 0.5 --samples 1 --out e.csv --alg confidence_threshold --threshold 0.7"
    rc, _, _ = run_cli(capsys, *shlex.split(cmd))
    with open(files / "e.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rc == 0 and [r["method"] for r in rows] == ["prefilling"]
    # every decoding setting is on the row (draw order, threshold and confidence source were missing)
    assert (rows[0]["threshold"], rows[0]["draw_order"], rows[0]["confidence_from"]) == ("0.7", "batched", "")


def test_no_option_abbreviations(files):
    for argv in (
        ["generate", "--prompt"],
        ["eval", "passkey", "--sample", "2"],
        ["encode", "--context-file", "doc.txt", "--out", "x", "--chunk", "64"],
    ):
        with pytest.raises(UserError, match="unrecognized arguments"):
            build_parser().parse_args(argv)


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
    base += ["--stats", "json", "--adaptive-k", "off"]  # a fixed K (the bundled file's K is adaptive)
    rc, _, err = run_cli(capsys, *base, "--gen-length", "4", "--chunk-size", "1024")
    stats = json.loads(err.strip().splitlines()[-1])
    assert rc == 0 and stats["num_chunks"] == 3 and stats["selected_chunks"] == [0, 1, 2]
    assert "s_I" not in stats  # nothing was scored, so no score is reported
    rc, _, err = run_cli(
        capsys, *base, "--gen-length", "4", "--chunk-size", "256", "--top-k", "all", "--boundary-snap", "0"
    )
    stats = json.loads(err.strip().splitlines()[-1])
    assert rc == 0 and stats["selected_chunks"] == list(range(12))


BAD_INPUTS = {  # name: (command line after "python -m dllm", what its error line says)
    "eval kv_retrieval in prose": ("eval kv_retrieval --haystack pydoc", "--haystack pydoc goes with the tasks"),
    "missing prompt file": ("generate --prompt-file nope.txt", "nope.txt': no such file"),
    "prompt path is a folder": ("generate --prompt-file .", "not a file"),
    "missing context file": ("generate --prompt-file prompt.txt --context-file x.txt", "no such file"),
    "missing model": ("generate --prompt-file prompt.txt --model nope", "no such directory"),
    "model folder without config": ("generate --prompt-file noslot.txt --model .", "config.json"),
    "empty context": ("generate --prompt-file prompt.txt --context-file empty.txt", "is empty"),
    "slot without context": ("generate --prompt-file prompt.txt", "no --context-file"),
    "context without slot": ("generate --prompt-file noslot.txt --context-file doc.txt", "exactly one {context} slot"),
    "top_k above the chunks": (
        "generate --prompt-file prompt.txt --context-file doc.txt --method prefilling --chunk-size 256 --top-k 14",
        "--top-k 14 exceeds the 13 chunk",  # K is checked against the snapped chunk count
    ),
    "chunk size 0": ("eval passkey --method prefilling --chunk-size 0", "integer >= 1, got '0'"),
    "unknown score term": ("eval passkey --method prefilling --score-terms s_X", "invalid choice"),
    "token budget above the chunk size": (
        "eval passkey --method prefilling --chunk-size 64 --token-budget 65",
        "--token-budget (B) must be in [1, --chunk-size=64] or 'all', got 65",
    ),
    "prefilling option with dense": (
        "eval passkey --method dense --top-k 2",
        "--top-k: option(s) of --method prefilling, not of --method dense",
    ),
    "graph option with dense": (
        "generate --prompt-file prompt.txt --context-file doc.txt --method dense --no-cuda-graph",
        "--no-cuda-graph: option(s) of --method prefilling",
    ),
    "repeated score term": (  # it would count twice in the chunk score (the harness refuses it too)
        "eval passkey --score-terms self_info pseudo_label self_info",
        "--score-terms: self_info given more than once",
    ),
    "top-k word": ("eval passkey --method prefilling --top-k most", "integer >= 1, got 'most'"),
    "gen length 0": ("eval passkey --gen-length 0", "integer >= 1"),
    "negative temperature": ("eval passkey --temperature -1", "number >= 0"),
    "threshold above 1": ("eval passkey --threshold 1.5", "--threshold must be in (0, 1], got 1.5"),
    "chunk beyond the trained positions": (
        "encode --context-file doc.txt --out d.cache --chunk-size 99999",
        "--chunk-size 99999: a chunk and its BOS anchor take 100000 positions, more than the model's 1536",
    ),
    "prefilling chunk beyond the trained positions": (
        "eval passkey --method prefilling --chunk-size 1536",
        "more than the model's 1536 trained positions",
    ),
    "eval --out in a missing folder": ("eval passkey --out nowhere/x.csv", "--out nowhere/x.csv: no such directory"),
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
    "context beyond the longest eval builds": (  # it ran out of memory building the haystack
        "eval passkey --lengths 4096 100000000",
        "argument --lengths: 100000000 tokens is more than 1048576 (1M), the longest context eval builds",
    ),
    "longbench without data": ("eval longbench", "--data FILE.jsonl"),
    "missing longbench file": ("eval longbench --data nope.jsonl", "no such file"),
    "limit without longbench": ("eval passkey --limit 3", "--limit goes with the longbench task"),
    "longbench file that is not JSON": ("eval longbench --data prompt.txt", "not valid JSON"),
    "eval --out that is its --data": (  # it overwrote the data set with the CSV, exit 0
        "eval longbench --data hotpotqa.jsonl --out hotpotqa.jsonl",
        "--out hotpotqa.jsonl is the --data: the CSV would overwrite the data set",
    ),
    "unknown block cache": ("generate --prompt-file noslot.txt --block-cache sometimes", "or an int >= 1"),
    "block cache interval 0": ("generate --prompt-file noslot.txt --block-cache 0", "or an int >= 1, got '0'"),
    "reselect with one block": (  # it was ignored in silence
        "generate --prompt-file noslot.txt --gen-length 8 --reselect 1",
        "--reselect re-selects at block starts: pass --block-length",
    ),
    "reselect with dense": (
        "generate --prompt-file noslot.txt --method dense --reselect 1 --gen-length 64 --block-length 32",
        "--reselect: option(s) of --method prefilling, not of --method dense",
    ),
    "chat without a chat template": (
        "generate --prompt-file prompt.txt --context-file doc.txt --chat",
        "has no chat template",
    ),
    "info of a missing model": ("info --model nope", "no such directory"),
    "no command": ("", "required: COMMAND"),
    # found by trying to break the CLI; each is reported before the model loads (test below)
    "infinite temperature": ("generate --prompt-file noslot.txt --temperature inf", "finite number >= 0, got 'inf'"),
    "seed beyond 64 bits": ("generate --prompt-file noslot.txt --seed 99999999999999999999999", "in [0, 2**64)"),
    "negative seed": ("generate --prompt-file noslot.txt --seed -1", "got '-1' (leave --seed out: unseeded)"),
    "empty --out of encode": ("encode --context-file doc.txt --out ''", "--out is empty"),
    "empty --out of eval": ("eval passkey --out ''", "--out is empty"),
    "empty question": ("generate --context-file doc.txt --question ''", "--question #1 is empty"),
    "nothing after the context slot": (  # prefilling's query; dense may continue the text (test below)
        "generate --prompt-file slot_last.txt --context-file doc.txt --method prefilling",
        "no text after its {context} slot",
    ),
    "nothing after the slot, default method": (  # prefilling is the default with a context
        "generate --prompt-file slot_last.txt --context-file doc.txt",
        "no text after its {context} slot: --method prefilling (the default with a context)",
    ),
    # no abbreviations: a misspelt or shortened option is an error, never another option
    "abbreviated --context-file": ("generate --prompt-file prompt.txt --context doc.txt", "unrecognized arguments"),
    "abbreviated --method": ("eval passkey --meth dense", "unrecognized arguments: --meth"),
    "whitespace question": ("generate --prompt-file prompt.txt --context-file doc.txt --question ' '", "#1 is empty"),
    "document cache from a pipe": ("generate --document pipe.fifo --prompt-file prompt.txt", "not a regular file"),
    "gen length beyond the model's positions": (
        "generate --prompt-file noslot.txt --gen-length 99999999999",
        "max_position_embeddings=1536",
    ),
    "longbench file not UTF-8": ("eval longbench --data latin1.jsonl", "latin1.jsonl: not UTF-8 text"),
    "longbench line nested too deeply": ("eval longbench --data deep.jsonl", "deep.jsonl:1 is not valid JSON (nested"),
    "longbench context empty": (  # the error names the line
        "eval longbench --data empty_context.jsonl",
        "--data empty_context.jsonl:2: the context is empty: --method prefilling has nothing to chunk",
    ),
    "longbench context of whitespace only": (  # it was decoded, where generate --context-file refuses it
        "eval longbench --data blank_context.jsonl",
        "--data blank_context.jsonl:2: the context is empty",
    ),
    "length of a longbench question beyond the window": (  # generate refuses the same prompt
        "eval longbench --data long_question.jsonl --gen-length 4",
        "--data long_question.jsonl:2: its prefix + query (16",
    ),
    "context file is /dev/zero": (
        "generate --prompt-file prompt.txt --context-file /dev/zero",
        "'/dev/zero': a device, not a file, pipe or terminal",
    ),
    "prompt file is /dev/urandom": ("generate --prompt-file /dev/urandom", "a device, not a file, pipe or terminal"),
    "length of prompt + response beyond the window": (
        "generate --prompt-file noslot.txt --gen-length 1530",
        "take 1569 positions, more than the model's 1536 trained positions",
    ),
    "out is a device": ("encode --context-file doc.txt --out /dev/null", "--out /dev/null exists and is not a regular"),
    "misspelled backend": ("eval passkey", "PREFILLING_DLLM_BACKEND='tritn'"),
    "misspelled check values": ("eval passkey", "PREFILLING_DLLM_CHECK_VALUES must be 1/true/yes, 0/false/no"),
    "length of an eval response beyond the window": (
        "eval passkey --lengths 64 --samples 1 --depths 0 --gen-length 1530",
        "more than the model's 1536 trained positions",
    ),
    "length of prefix + query + response beyond the window": (
        f"generate --prompt-file prompt.txt {TUNED} --gen-length 1500",
        "prefix + query (",
    ),
}
AFTER_LOAD = ("chat", "length", "model", "top_k")  # need the tokenizer (or are the loader's own errors)
BEFORE_LOAD = [name for name in BAD_INPUTS if name.split()[0] not in AFTER_LOAD]


@pytest.mark.parametrize("argv,message", list(BAD_INPUTS.values()), ids=list(BAD_INPUTS))
def test_user_errors_are_one_line_and_exit_2(files, capsys, argv, message):
    rc, out, err = run_cli(capsys, *shlex.split(argv))
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
    assert "Traceback" not in err and out == ""


@pytest.mark.parametrize("name", BEFORE_LOAD)
def test_user_errors_are_found_before_the_model_loads(files, capsys, monkeypatch, name):
    """A 7B checkpoint takes minutes to load: a mistake in the command line must not wait for it, and
    its message is the same whether the model could load or not."""
    argv, message = BAD_INPUTS[name]
    loads = []
    real_load = dllm.load_model
    monkeypatch.setattr(dllm, "load_model", lambda *a, **k: loads.append(1) or real_load(*a, **k))
    rc, _, with_model = run_cli(capsys, *shlex.split(argv))
    assert rc == 2 and loads == [], with_model

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the error was found")

    monkeypatch.setattr(dllm, "load_model", no_load)
    rc, _, err = run_cli(capsys, *shlex.split(argv))
    assert rc == 2 and message in err and err == with_model, err


def test_dense_may_end_its_prompt_with_the_context(files, capsys):
    """Only prefilling needs a query after {context}; a dense prompt may end with the document."""
    rc, out, err = run_cli(
        capsys,
        *("generate", "--prompt-file", "slot_last.txt", "--context-file", "doc.txt", "--method", "dense"),
        *("--gen-length", "2", "--stats", "json"),
    )
    assert rc == 0 and out.endswith("\n") and json.loads(err.strip().splitlines()[-1])["steps"] == 2, err


@pytest.mark.parametrize(
    "exc,where",
    [
        (
            torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.00 GiB. GPU 0 has"),
            "the GPU, tried to allocate 12.00 GiB",
        ),
        (
            RuntimeError(
                "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried "
                "to allocate 1125899906842624 bytes. Error code 12 (Cannot allocate memory)"  # torch.empty(2**50)
            ),
            "CPU memory, tried to allocate 1125899906842624 bytes",
        ),
        (
            RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried"),
            "CPU memory",
        ),
        (MemoryError(), "CPU memory"),
    ],
    ids=["cuda", "cpu-size", "cpu", "python"],
)
def test_out_of_memory_is_one_line_with_what_to_lower(files, capsys, monkeypatch, exc, where):
    def oom(*a, **k):
        raise exc

    monkeypatch.setattr(dllm, "generate", oom)
    rc, out, err = run_cli(capsys, "generate", "--prompt-file", "noslot.txt", "--gen-length", "4")
    lines = err.strip().splitlines()
    assert rc == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith("error: out of memory") and "--gen-length" in lines[0]
    assert f"({where})" in lines[0], lines[0]
    monkeypatch.setattr(dllm, "generate", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):  # other runtime errors are bugs: they keep their traceback
        main(["generate", "--prompt-file", "noslot.txt", "--gen-length", "4"])


def test_ctrl_c_is_one_line_and_exit_130(files, capsys, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(dllm, "load_model", interrupted)
    rc, out, err = run_cli(capsys, "generate", "--prompt-file", "noslot.txt")
    assert rc == 130 and out == "" and err == "interrupted\n"
    with pytest.raises(KeyboardInterrupt):
        main(["generate", "--prompt-file", "noslot.txt", "--debug"])


def test_context_from_a_pipe(files, capsys):
    """``--context-file <(...)`` (a shell's process substitution) is a FIFO, not a regular file: it is read once."""
    fifo = files / "ctx.fifo"
    os.mkfifo(fifo)
    text = (files / "doc.txt").read_text()
    writer = threading.Thread(target=lambda: fifo.write_text(text), daemon=True)
    writer.start()
    piped = TUNED.replace("doc.txt", str(fifo))
    rc, out, err = run_cli(capsys, *shlex.split(f"generate --prompt-file prompt.txt {piped}"), "--gen-length", "8")
    assert rc == 0, err
    writer.join(timeout=5)
    piped_out = out
    rc, out, _ = run_cli(capsys, *shlex.split(f"generate --prompt-file prompt.txt {TUNED}"), "--gen-length", "8")
    assert rc == 0 and out == piped_out and "12345" in out


def test_dense_beyond_the_window_with_a_long_context_runs_with_a_note(files, capsys, monkeypatch):
    """The dense baseline on a context past the window is measured on purpose: a note, not an error."""
    (files / "long.txt").write_text(FILLER * 60)  # ~2200 tokens for a 1536-position model
    cmd = "generate --prompt-file prompt.txt --context-file long.txt --method dense --gen-length 4"
    rc, out, err = run_cli(capsys, *shlex.split(cmd))
    assert rc == 0 and "note: the prompt (" in err and "more than the model's 1536 trained positions" in err
    rc, out, err = run_cli(capsys, *shlex.split(cmd), "--stats", "json")
    lines = [json.loads(line) for line in err.strip().splitlines()]  # raises on a plain-text line
    assert rc == 0 and lines[0]["note"].startswith("the prompt (") and "nfe" in lines[1]


def test_triton_backend_without_the_interpreter_is_one_error_line(files, capsys, monkeypatch):
    import triton_kernels._dispatch as dispatch

    monkeypatch.setenv("PREFILLING_DLLM_BACKEND", "triton")
    monkeypatch.setattr(dispatch, "is_interpreted", lambda kernel: False)  # as without TRITON_INTERPRET=1
    loads = []
    monkeypatch.setattr(dllm, "load_model", lambda *a, **k: loads.append(1))
    rc, out, err = run_cli(capsys, *shlex.split(f"generate --prompt-file prompt.txt {TUNED}"))
    assert rc == 2 and loads == [] and out == ""
    assert err.strip().splitlines() == [
        "error: PREFILLING_DLLM_BACKEND=triton on the CPU needs the Triton interpreter: set TRITON_INTERPRET=1 too "
        "(slow; for tests), or unset PREFILLING_DLLM_BACKEND"
    ]


def test_info_ignores_the_kernel_backend(files, capsys, monkeypatch):
    import triton_kernels._dispatch as dispatch

    monkeypatch.setenv("PREFILLING_DLLM_BACKEND", "triton")
    monkeypatch.setattr(dispatch, "is_interpreted", lambda kernel: False)
    rc, out, err = run_cli(capsys, "info")
    assert rc == 0 and "dream" in out.lower(), err


def test_prefilling_past_the_window_through_its_kept_chunks_gets_a_note(files, capsys):
    # 4 kept chunks of 256 + anchors take 1028 positions before the query: with 600 response tokens the
    # last ones sit past the 1536 trained positions although prefix + query + response fit (a fixed K: the
    # bundled file's adaptive K gets the note of the test below)
    fixed = f"{TUNED} --adaptive-k off"
    rc, out, err = run_cli(
        capsys, *shlex.split(f"generate --prompt-file prompt.txt {fixed} --gen-length 600 --steps 1")
    )
    assert rc == 0, err
    assert "note: prefix, kept chunks, query and --gen-length 600 reach position" in err
    # --stats json: every stderr line is JSON, the note too
    rc, out, err = run_cli(
        capsys, *shlex.split(f"generate --prompt-file prompt.txt {fixed} --gen-length 600 --steps 1 --stats json")
    )
    lines = [json.loads(line) for line in err.strip().splitlines()]  # raises on a plain-text line
    assert rc == 0 and [set(d) for d in lines[:1]] == [{"note"}] and "nfe" in lines[-1]
    assert lines[0]["note"].startswith("prefix, kept chunks, query and --gen-length 600 reach position")


def test_window_note_with_adaptive_k_speaks_of_the_ceiling(files, capsys):
    """With --adaptive-k the count is chosen after scoring: the note may not claim that K chunks reach past the
    window (a new user kept 1 chunk of 114 and was told to lower --top-k); it says 'if ... keeps as many'."""
    cmd = f"generate --prompt-file prompt.txt {TUNED} --gen-length 600 --steps 1 --adaptive-k 1.5 --stats json"
    rc, out, err = run_cli(capsys, *shlex.split(cmd))
    lines = [json.loads(line) for line in err.strip().splitlines()]
    notes = [d["note"] for d in lines if set(d) == {"note"}]
    assert rc == 0 and len(notes) == 1, err
    assert notes[0].startswith("if adaptive K keeps as many chunks as --top-k allows, prefix, kept chunks, query")
    assert "reach position" in notes[0] and "the stats line shows what was kept" in notes[0]


def test_kept_positions_bound_every_snapped_cut():
    """The window check counts the snapped chunks, not ceil(L / C) fixed ones: with snapped boundaries there can
    be more (each at most C tokens), and K of them take up to the K largest sizes plus K anchors. L = 768 =
    3 x 256 cut into 5 snapped chunks with K = 5: counting fixed chunks gives 3 x 257 = 771 positions, the five
    chunks and their anchors take 768 + 5 = 773."""
    import random

    from dllm.cli.options import kept_positions

    rng = random.Random(0)
    for _ in range(300):
        c, n, k = rng.randint(2, 300), rng.randint(1, 9), rng.randint(1, 10)
        sizes = [rng.randint(1, c) for _ in range(n)]  # any cut: every chunk at most C tokens
        cfg = PrefillingConfig(chunk_size=c, top_k=k)
        worst = sum(sorted(sizes, reverse=True)[:k]) + min(k, n)  # the K largest chunks and their anchors
        got = kept_positions(cfg, sum(sizes), n)
        assert got >= worst, (c, sizes, k, got)
        if k >= n:
            assert got == sum(sizes) + n  # every chunk kept: exact
    cfg = PrefillingConfig(chunk_size=256, top_k=5, boundary_snap=64)
    assert kept_positions(cfg, 768, 5) == 773 > 771


def test_a_fifo_without_a_writer_says_it_waits(files, capsys):
    fifo = files / "late.fifo"
    os.mkfifo(fifo)
    text = (files / "doc.txt").read_text()
    writer = threading.Timer(1.6, lambda: fifo.write_text(text))
    writer.start()
    piped = TUNED.replace("doc.txt", str(fifo))
    rc, out, err = run_cli(capsys, *shlex.split(f"generate --prompt-file prompt.txt {piped}"), "--gen-length", "8")
    writer.join(timeout=5)
    assert rc == 0 and "12345" in out
    assert f"waiting for a writer on --context-file {fifo} ..." in err


def test_input_beyond_the_size_limit_is_one_error_line(files, capsys, monkeypatch):
    import dllm.cli.files

    monkeypatch.setattr(dllm.cli.files, "MAX_INPUT_BYTES", 100)
    rc, out, err = run_cli(capsys, *shlex.split("generate --prompt-file prompt.txt --context-file doc.txt"))
    assert rc == 2 and err.strip() == "error: --context-file doc.txt: more than 100 bytes of text"


def test_debug_shows_the_traceback(files):
    with pytest.raises(UserError, match="no --context-file"):
        main(["generate", "--prompt-file", "prompt.txt", "--debug"])
    with pytest.raises(ValueError, match="config.json"):
        main(["generate", "--prompt-file", "noslot.txt", "--model", ".", "--debug"])


def test_eval_writes_csv_rows_after_an_untimed_warm_up(tmp_path, monkeypatch, capsys):
    calls = []
    real = dllm.eval.evaluation.run_case
    monkeypatch.setattr(dllm.eval.evaluation, "run_case", lambda *a, **k: calls.append(a[1].seed) or real(*a, **k))
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


def test_eval_says_which_cases_reach_past_the_trained_window(files, capsys):
    """A dense LongBench case past the window runs (as generate runs that prompt) with a note, and the CSV
    says which case it was; prefilling refuses it by its line (test_user_errors_... above)."""
    cmd = "eval longbench --data long_question.jsonl --method dense --gen-length 4 --steps 1 --out window.csv"
    rc, out, err = run_cli(capsys, *shlex.split(cmd))
    assert rc == 0, err
    assert "note: in 1 of 2 cases the prompt and response reach past the model's 1536 trained positions" in err
    rows = list(csv.DictReader((files / "window.csv").open()))
    assert [r["past_window"] for r in rows] == ["False", "True"]
    # the bundled model reads one token a character: BOS + the prompt's characters + 4 response tokens
    prompts = [
        x["context"] + f"\n\nQuestion: {x['input']}\nAnswer: " for x in map(json.loads, open("long_question.jsonl"))
    ]
    assert [int(r["positions"]) for r in rows] == [1 + len(p) + 4 for p in prompts]


def test_eval_haystack_draws_held_out_prose_cases(tmp_path, capsys):
    """--haystack pydoc: the rows are the held-out (split eval) pydoc cases of make_case, not filler ones."""
    from dllm.eval.tasks import make_case

    out = tmp_path / "rows.csv"
    cmd = "eval word_fact --haystack pydoc --lengths 400 --depths 0.5 --samples 2 --gen-length 12"
    rc, _, _ = run_cli(capsys, *shlex.split(cmd), "--out", str(out))
    assert rc == 0
    gold = [r["gold"] for r in csv.DictReader(out.open())]
    want = [make_case("word_fact", 400, 0.5, s, haystack="pydoc", split="eval").answer for s in (0, 1)]
    assert gold == want and want != [make_case("word_fact", 400, 0.5, s).answer for s in (0, 1)]
