"""bench/tiny/gpu_run.py and gpu_scratch.sh: the CPU dry run of the GPU script (plumbing, resume, output files)."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.tiny import corpus, gpu_run, sources
from bench.tiny.train import SizeError, _init_model

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--hidden-size", "32", "--layers", "2", "--heads", "2", "--kv-heads", "1", "--intermediate-size", "64"]


@pytest.fixture()
def small_corpus(monkeypatch, tmp_path):
    docs = [
        (
            f"d{i}",
            f"Report {i}. " + " ".join(f"item{j} cost {j * 7}.{i}0 on 2024-02-{j % 28 + 1:02d}" for j in range(80)),
        )
        for i in range(4)
    ]
    reg = {"t": sources.Source("t", "test", False, lambda: iter(docs), "test")}
    monkeypatch.setattr(sources, "SOURCES", reg)
    monkeypatch.setattr(sources, "HELD_OUT_SOURCES", ())
    monkeypatch.setattr(sources, "TRAINING_SOURCES", ("t",))
    corpus.build(str(tmp_path / "corpus"), {"t": 10**6})
    return str(tmp_path / "corpus")


def test_n_params_counts_the_model_and_the_size_limit_is_the_8_files():
    for arch in (
        {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
        },
        {
            "hidden_size": 48,
            "intermediate_size": 80,
            "num_hidden_layers": 1,
            "num_attention_heads": 6,
            "num_key_value_heads": 3,
        },
    ):
        full = arch | {"rope_theta": 1e4, "rms_norm_eps": 1e-6}
        assert gpu_run.n_params(full, 100) == sum(p.numel() for p in _init_model(100, full).parameters())
    size = {"num_attention_heads": 6, "num_key_value_heads": 2, "intermediate_size": 1024, "hidden_size": 384}
    # 384 x 6: 9.52M parameters x 8 bytes = 76 MB = 5 shards of 15 MiB; 384 x 8: 12.7M = 7 shards, over 6
    assert gpu_run.check_fits(size | {"num_hidden_layers": 6}, 100) == 5
    with pytest.raises(SizeError, match="12.7M parameters need 7 state shards"):
        gpu_run.check_fits(size | {"num_hidden_layers": 8}, 100)
    # the default size: its state (8 bytes a parameter) and an 8 MiB corpus fit the 64 MiB carried to a GPU machine
    default = gpu_run.GPU_SIZE | {"rope_theta": 1e4, "rms_norm_eps": 1e-6}
    assert gpu_run.n_params(default, 100) * 8 + (8 << 20) <= gpu_run.CARRY_BYTES


def test_state_shards_round_trip(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_run, "SHARD_BYTES", 20_000)
    arch = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "rope_theta": 1e4,
        "rms_norm_eps": 1e-6,
    }
    model = _init_model(100, arch)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randint(4, 100, (1, 8)), torch.arange(8)).logits.sum().backward()
    opt.step()
    (tmp_path / "state-00009-of-00009.safetensors").write_bytes(b"stale")
    files = gpu_run.save_state(str(tmp_path), model, opt, {"step": 1})
    assert len(files) > 3 and all((tmp_path / f).stat().st_size <= 20_000 + 4096 for f in files)
    assert sorted(os.listdir(tmp_path)) == sorted(files + ["run.json"])  # the stale shard removed
    meta, tensors = gpu_run.load_state(str(tmp_path))
    assert meta["step"] == 1 and meta["shards"] == files
    for n, p in model.named_parameters():
        assert torch.equal(tensors[f"model/{n}"], p.detach())
        m = opt.state[p]["exp_avg_sq"]
        assert torch.allclose(tensors[f"exp_avg_sq/{n}"].float(), m, rtol=2**-8, atol=0)


def test_gpu_script_dry_runs_on_cpu_resumes_and_exports(small_corpus, tmp_path):
    """gpu_scratch.sh with DEVICE=cpu on a tiny size: 3 steps with one worker process, then a fresh run (in-process
    batches) resumes from the first call's files (as a new GPU machine would) and continues to step 6; the loss
    log equals an uninterrupted in-process run's (the data is a function of the step; the resumed AdamW
    moments are bf16-rounded, so to 1e-3); at most 8 files of at most 16 MiB; the export loads."""
    from dllm.model.loader import load_model

    flags = ["--steps", "6", "--token-budget", "768", "--window", "256", "--log-every", "1", "--no-bf16", *TINY]
    script = str(ROOT / "bench" / "tiny" / "gpu_scratch.sh")
    env = os.environ | {"DEVICE": "cpu", "PYTHON": sys.executable, "CORPUS": small_corpus, "OMP_NUM_THREADS": "1"}
    first, second = tmp_path / "call1", tmp_path / "call2"
    env |= {"OUT": str(first), "STATE": str(tmp_path / "state")}
    done = subprocess.run(["bash", script, *flags, "--stop-at", "3", "--workers", "1"], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 workers" in done.stdout and "stopped at step 3 of 6" in done.stdout
    assert sorted(os.listdir(first)) == sorted(os.listdir(tmp_path / "state"))  # the state copied into $OUT
    empty = env | {"STATE": str(tmp_path / "nothing"), "RESUME": "1"}
    done = subprocess.run(["bash", script], env=empty, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("error: RESUME is set but") and not done.stdout

    def main(*argv):
        threads = torch.get_num_threads()
        try:
            return gpu_run.main(["--corpus", small_corpus, "--device", "cpu", *flags, "--workers", "0", *argv])
        finally:
            torch.set_num_threads(threads)

    assert main("--out", str(second), "--resume", str(first)) == 0  # a new machine: only call 1's files
    files = sorted(os.listdir(second))
    assert len(files) <= 8 and all((second / f).stat().st_size <= 16 << 20 for f in files)
    assert files == ["loss.csv", "run.json", "state-00001-of-00001.safetensors"]
    rows = list(csv.DictReader((second / "loss.csv").open()))
    assert [r["step"] for r in rows] == ["1", "2", "3", "4", "5", "6"]
    whole = tmp_path / "whole"
    assert main("--out", str(whole)) == 0
    ref = list(csv.DictReader((whole / "loss.csv").open()))
    assert [r["tokens"] for r in rows] == [r["tokens"] for r in ref]
    for a, b in zip(rows, ref):
        assert float(a["loss"]) == pytest.approx(float(b["loss"]), abs=1e-3)
    model_dir = tmp_path / "model"
    assert gpu_run.main(["export", "--state", str(second), "--model", str(model_dir)]) == 0
    model = load_model(str(model_dir))
    _, tensors = gpu_run.load_state(str(second))
    assert model.config.hidden_size == 32 and model.config.num_layers == 2
    for n, p in model.named_parameters():
        assert torch.equal(p.detach().float(), tensors[f"model/{n}"])


def test_bad_runs_are_one_error_line(small_corpus, tmp_path, capsys):
    args = ["--out", str(tmp_path / "o"), "--corpus", small_corpus, "--device", "cpu", "--workers", "0"]
    assert gpu_run.main(args + ["--hidden-size", "512", "--heads", "8", "--layers", "8"]) == 2  # 16M: 9 shards
    assert gpu_run.main(args + ["--resume", str(tmp_path / "none")]) == 2
    assert (
        gpu_run.main(
            [
                "--out",
                str(tmp_path / "o"),
                "--corpus",
                str(tmp_path / "nocorpus"),
                "--device",
                "cpu",
                "--workers",
                "0",
                *TINY,
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().split("\n")
    assert len(err) == 3 and all(e.startswith("error: ") for e in err)
    assert "state shards" in err[0] and "no run.json" in err[1] and "python -m bench.tiny.corpus" in err[2]
