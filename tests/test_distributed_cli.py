"""``torchrun ... -m dllm encode / generate`` on 2 gloo ranks started by the test (fork, one thread each), with
the environment torchrun sets: a FIFO ``--context-file`` and ``--questions-file -`` are read by rank 0 only and
broadcast (before, every rank read them: the second rank waited forever on the FIFO, and one rank read stdin
empty). The answers equal one process's from the same index."""

import os
import socket
import sys
import threading

import torch

from bench.speed.distributed import run_ranks
from dllm.cli.parser import main
from dllm.eval.tasks import make_case

CASE = make_case("passkey", 900, 0.6, 3)
QUESTIONS = ["What is the pass key? The pass key is", "Tell me the pass key. The pass key is"]
TIMEOUT_S = 240  # both commands on both ranks, spawn included (seconds when idle; a hang is killed at this)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank, world, ports, workdir, stdin_fd):
    """One torchrun rank: both commands through ``python -m dllm``'s entry point; rc and output to files."""
    torch.set_num_threads(1)
    os.chdir(workdir)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      PREFILLING_DLLM_DIST_TIMEOUT="60")  # fmt: skip
    sys.stdin = open(stdin_fd, closefd=False)  # one pipe shared by every rank, as torchrun's workers share stdin
    codes = []
    with open(f"rank{rank}.out", "w") as out, open(f"rank{rank}.err", "w") as err:
        sys.stdout, sys.stderr = out, err
        for port, argv in zip(ports, (
            ["encode", "--context-file", "ctx.fifo", "--out", "book.idx", "--device", "cpu", "--chunk-size", "128"],
            ["generate", "--document", "book.idx", "--prompt-file", "prompt.txt", "--questions-file", "-",
             "--device", "cpu", "--gen-length", "8", "--top-k", "2", "--stats", "none"],
            # stdin is now at its end: rank 0 reads no question, every rank ends with status 2, one error line
            ["generate", "--document", "book.idx", "--prompt-file", "prompt.txt", "--questions-file", "-",
             "--device", "cpu"],
        )):  # fmt: skip
            os.environ["MASTER_PORT"] = str(port)
            codes.append(main(argv))
            out.flush()
            err.flush()
    with open(f"rank{rank}.rc", "w") as f:
        f.write(" ".join(map(str, codes)))
    os._exit(0)


def test_rank0_reads_a_fifo_and_stdin_and_broadcasts(tmp_path, capsys, monkeypatch):
    os.mkfifo(tmp_path / "ctx.fifo")
    (tmp_path / "prompt.txt").write_text(CASE.prefix + "{context}" + CASE.query.split("What")[0] + "{question}")
    (tmp_path / "questions.txt").write_text("\n".join(QUESTIONS) + "\n")
    read_fd, write_fd = os.pipe()
    os.write(write_fd, ("\n".join(QUESTIONS) + "\n").encode())
    os.close(write_fd)

    def write_fifo():  # one writer, once: a second reader of the FIFO would wait forever
        with open(tmp_path / "ctx.fifo", "w") as f:
            f.write(CASE.context)

    writer = threading.Thread(target=write_fifo, daemon=True)
    writer.start()
    ports = (_free_port(), _free_port(), _free_port())
    procs, killed = run_ranks(_rank, 2, (2, ports, str(tmp_path), read_fd), TIMEOUT_S)
    os.close(read_fd)
    logs = {f: (tmp_path / f).read_text() for f in sorted(os.listdir(tmp_path)) if f.startswith("rank")}
    assert not killed, f"{killed} rank(s) still running after {TIMEOUT_S} s: {logs}"
    assert [logs.get(f"rank{r}.rc") for r in range(2)] == ["0 0 2", "0 0 2"], logs
    assert logs["rank1.out"] == logs["rank1.err"] == "", logs  # rank 0 speaks
    assert logs["rank0.err"].splitlines() == [
        "error: rank 0: --questions-file -: no questions (one per line; blank lines are skipped)"
    ], logs
    # one process answers the same questions from the same index (its shards re-split onto it)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.chdir(tmp_path)
    rc = main(["generate", "--document", "book.idx", "--prompt-file", "prompt.txt", "--questions-file",
               "questions.txt", "--gen-length", "8", "--top-k", "2", "--stats", "none"])  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert logs["rank0.out"].endswith(out) and "A1:" in out and "A2:" in out, (logs, out)
