"""The tiny model's training samples, batches and phase table (bench/tiny): layouts, roles, masks, schedule.

Expected values come from the sample definitions in bench/tiny/data.py's docstring, checked by
decoding the character ids back to text, not from the code paths that build them.
"""

import csv
import dataclasses
import inspect
import math
import random
from collections import Counter
from pathlib import Path

import pytest
import torch

from bench.tiny import data, train
from bench.tiny.curriculum import PHASES, draw_batch, draw_sample, run_at, schedule
from bench.tiny.tokenizer import CHARS
from bench.tiny.train import make_batch, parse_args


def text(ids):
    return "".join(CHARS[i - 4] if i >= 4 else f"<{i}>" for i in ids)


def part(s, role):
    return [t for t, r in zip(s.ids, s.role) if r == role]


def test_copy_sample_answer_is_the_context():
    for seed in range(5):
        s = data.copy_sample(random.Random(seed), 120)
        ctx, ans = part(s, "p"), part(s, "a")
        assert s.ids[0] == data.BOS and ans[-1] == data.EOS
        assert ans[:-1] == ctx and len(ctx) == 58  # (120 - 4) // 2
        assert text(part(s, "q")) == "\n\n"
        assert set(s.segment) == {0}


def test_copy_sample_digit_pool_holds_digits_only():
    s = data.copy_sample(random.Random(3), 200, pool="0123456789")
    ctx, ans = text(part(s, "p")), part(s, "a")
    assert len(ctx) == 98 and set(ctx) == set("0123456789")  # (200 - 4) // 2 characters, all ten digits
    assert text(ans[:-1]) == ctx and ans[-1] == data.EOS


def test_phase7_copy_strings_come_from_the_weighted_pools():
    phase7 = PHASES[6]
    copy = next(layout for _, layout in phase7.mix if layout.kind == "copy")
    only_copies = dataclasses.replace(phase7, mix=((1.0, copy),))  # every draw a copy string
    rng = random.Random(0)
    kinds = Counter()
    for _ in range(600):
        s, mode = draw_sample(rng, None, 200, only_copies)
        ctx = set(text(part(s, "p")))
        assert mode == "answer" and text(part(s, "a")[:-1]) == text(part(s, "p"))
        # 98 characters: a hex string always holds a letter a-f or a dash, a COPY_POOL one a g-z or space
        kinds["digits" if ctx <= set("0123456789") else "hex" if ctx <= set("0123456789abcdef-") else "mixed"] += 1
    # weights 0.5 / 0.25 / 0.25; 600 draws: 3 standard deviations are ~0.06 and ~0.05
    assert abs(kinds["hex"] / 600 - 0.5) < 0.07
    assert abs(kinds["digits"] / 600 - 0.25) < 0.06 and abs(kinds["mixed"] / 600 - 0.25) < 0.06


def test_phase8_trial_draws_no_copy_strings_and_the_stated_layout_shares():
    rng = random.Random(1)
    kinds = Counter()
    for _ in range(400):
        s, mode = draw_sample(rng, None, 400, PHASES[7])
        kinds["query" if mode == "query" else s.kind] += 1
    # 0% copy, 55% dense, 30% chunked, 15% query-only; 400 draws: 3 standard deviations are <= 0.075
    assert kinds["copy"] == 0
    assert abs(kinds["dense"] / 400 - 0.55) < 0.075 and abs(kinds["chunked"] / 400 - 0.30) < 0.07
    assert abs(kinds["query"] / 400 - 0.15) < 0.055


def test_chunked_sample_without_answer_ends_at_the_query_and_keeps_the_needle():
    rng = random.Random(3)
    for _ in range(10):
        s = data.chunked_sample(rng, 600, "passkey", answer=False)
        assert "a" not in s.role
        assert s.role[-1] == "q" and s.segment[-1] == 0
        static = text([t for t, g in zip(s.ids, s.segment) if g > 0])
        assert "pass key" in static or "passkey" in static.replace(" ", "")
        # every static segment opens with its own BOS
        starts = [i for i in range(len(s.ids)) if s.segment[i] > 0 and (i == 0 or s.segment[i - 1] != s.segment[i])]
        assert all(s.ids[i] == data.BOS for i in starts)


def test_needle_free_chunks_hold_no_key():
    rng = random.Random(4)
    for _ in range(10):
        s = data.chunked_sample(rng, 600, "passkey", drop_needle=True, answer=False)
        static = text([t for t, g in zip(s.ids, s.segment) if g > 0 and t >= 4])
        assert len(static) >= 50 and not any(c.isdigit() for c in static)  # passkey filler has no digits


def test_make_batch_masks_only_eligible_tokens_and_isolates_segments():
    rng = random.Random(0)
    samples = [data.chunked_sample(rng, 400, "passkey", answer=False) for _ in range(4)]
    gen = torch.Generator().manual_seed(0)
    inputs, targets, weights, _pos, attn = make_batch(samples, ["query"] * 4, gen, 512, weighting="mean")
    for i, s in enumerate(samples):
        n = len(s.ids)
        q = torch.tensor([r == "q" for r in s.role])
        masked = inputs[i, :n] == data.MASK
        assert masked.any() and not (masked & ~q).any()  # only query tokens are ever masked
        assert torch.allclose(weights[i].sum(), torch.tensor(1.0))  # per-row mean
        seg = torch.tensor(s.segment)
        # a static row sees exactly its own segment; a live row sees every real token
        for r in (0, n - 1):
            want = (seg == seg[r]) if seg[r] > 0 else torch.ones(n, dtype=torch.bool)
            assert torch.equal(attn[i, r, :n], want) and not attn[i, r, n:].any()
    assert torch.equal(targets[0, : len(samples[0].ids)], torch.tensor(samples[0].ids))


def test_schedule_follows_the_phase_table():
    runs = schedule(parse_args([]))
    assert [r.n for r in (run_at(runs, 899), run_at(runs, 900), run_at(runs, 11999))] == [1, 2, 7]
    assert len({run_at(runs, s).n for s in range(12000)}) == 7  # no phase 8 in the default run
    # phases 1-3: warm-up over 100 steps, then cosine over 0..1900 from 1.5e-3 down to 0.1 x peak
    assert run_at(runs, 0).lr(0) == pytest.approx(1.5e-3 / 100)
    assert run_at(runs, 99).lr(99) == pytest.approx(1.5e-3)
    # step 1000: (1000 - 100) / (1900 - 100) = half way: 1.5e-3 * (0.1 + 0.9 * 0.5 * (1 + cos(pi / 2)))
    assert run_at(runs, 1000).lr(1000) == pytest.approx(1.5e-3 * 0.55)
    # phase 4 restarts: 50 warm-up steps from 1e-3 at its first step
    assert run_at(runs, 1900).lr(1900) == pytest.approx(1e-3 / 50)
    # --steps past the end of phase 7 adds the trial phase 8; a shorter --steps ends phase 7's cosine there
    trial = schedule(parse_args(["--steps", "14000"]))
    assert run_at(trial, 12000).n == 8 and run_at(trial, 12000).lr(12000) == pytest.approx(3e-4 / 50)
    short = run_at(schedule(parse_args(["--steps", "11000"])), 10999)
    # (10999 - 9500 - 50) / (1500 - 50) = 1449 / 1450 of the way down from 5e-4
    assert short.lr(10999) == pytest.approx(5e-4 * (0.1 + 0.45 * (1 + math.cos(math.pi * 1449 / 1450))))
    moved = schedule(parse_args(["--phase4", "3000", "--lr5", "1e-3"]))
    assert run_at(moved, 2999).n == 4 and run_at(moved, 3000).n == 5
    assert run_at(moved, 3000).lr(3000) == pytest.approx(1e-3 / 50)


def test_flags_and_docs_come_from_the_phase_table():
    args = parse_args([])
    assert [getattr(args, f"phase{n}") for n in range(1, 8)] == [900, 1350, 1900, 3300, 6000, 9500, 12000]
    assert (args.lr, args.lr4, args.lr5, args.lr6, args.lr7, args.lr8, args.steps) == (
        1.5e-3,
        1e-3,
        7e-4,
        5e-4,
        5e-4,
        3e-4,
        12000,
    )
    assert args.weighting == "mean" and inspect.signature(make_batch).parameters["weighting"].default == "mean"
    doc = train.__doc__
    for ph, n in zip(PHASES, range(1, 9)):
        assert f"phase {n} (steps {ph.first}-{ph.end}," in doc
    # phase 5's thresholds 0.75 / 0.875 / 1.0: 12.5% query-only beside the needle chunk and 12.5% beside none
    assert "12.5% query-only beside the needle chunk, 12.5% query-only beside needle-free chunks" in doc
    # phase 1: samples of max(96, 192 // 2) to 192 - 8 tokens
    assert "phase 1 (steps 0-900, own warm-up and cosine from lr 0.0015, 96-184-token samples in batches of 192)" in doc


def test_the_committed_run_replays_its_logged_batches():
    """bench/results/tiny-train/loss.csv logs the run that made the bundled model: per step its phase, batch
    length and batch size. Drawn again from --seed 0 with the default flags, the batches match it; the
    length of a step's batch is the first draw after every sample of the steps before, so through step 960
    (60 steps of phase 2's five buckets) this checks the whole sample stream so far."""
    logged = {}
    with open(Path(__file__).parents[1] / "bench" / "results" / "tiny-train" / "loss.csv") as f:
        for row in csv.reader(f):
            logged[int(row[0])] = tuple(int(x) for x in row[1:4])  # a resumed step's last entry wins
    args = parse_args([])
    runs, rng, essays = schedule(args), random.Random(args.seed), data.EssayStream()
    for step in range(960):
        run = run_at(runs, step)
        length, samples, _ = draw_batch(rng, essays, run.spec, args.window, args.token_budget)
        assert (run.n, length, len(samples)) == logged[step], step


def test_phase9_prose_trial_shares_and_its_prose_is_from_the_training_split():
    """Phase 9 (the prose fine-tune): 10% copy, 35% dense, 30% chunked, 25% query-only split evenly between
    chunk sets with and without the needle; a third of the retrieval samples in the InfiniteBench noise,
    the rest in prose; word facts among the answers; never a 12-word run of an evaluation essay."""
    from dllm.eval.tasks.digits import NOISE_POOL
    from dllm.eval.tasks.essays import load_essays

    ph = PHASES[8]
    assert ph.trial and ph.first == 14000 and ph.lr == (4e-4, 50)
    held = set()
    for _, t in load_essays("eval"):
        w = t.split()
        held |= {" ".join(w[i : i + 12]) for i in range(len(w) - 11)}
    rng = random.Random(2)
    kinds, filler, answers = Counter(), 0, Counter()
    n = 400
    for _ in range(n):
        s, mode = draw_sample(rng, None, 700, ph)
        kinds[(mode, s.kind)] += 1
        if s.kind == "copy":
            continue
        body = text(part(s, "p"))
        filler += any(sentence in body for sentence in NOISE_POOL)
        words = body.replace("<1>", " ").split()
        assert not any(" ".join(words[i : i + 12]) in held for i in range(0, len(words) - 11, 3))
        q = text(part(s, "q"))
        answers["word" if "secret" in q and ("city" in q or "animal" in q or "color" in q) else "digits"] += 1
    retrieval = n - kinds[("answer", "copy")]
    assert abs(kinds[("answer", "copy")] / n - 0.10) < 0.045
    assert abs(kinds[("answer", "dense")] / n - 0.35) < 0.075
    assert abs(kinds[("query", "chunked")] / n - 0.125) < 0.05  # query-only beside the needle chunk
    assert abs(kinds[("query", "no_needle")] / n - 0.125) < 0.05  # query-only beside needle-free chunks
    assert abs(filler / retrieval - 1 / 3) < 0.08
    assert abs(answers["word"] / retrieval - 0.3) < 0.075


def test_phase9_runs_alone_from_given_weights_and_the_default_run_stops_before_it():
    args = parse_args(["--phase", "9", "--init", "dllm/assets/tiny-dream"])
    assert args.phase == 9 and args.lr9 == 4e-4 and args.device == "cpu"
    assert len({run_at(schedule(parse_args([])), s).n for s in range(12000)}) == 7
    trial8 = schedule(parse_args(["--steps", "14000"]))
    assert run_at(trial8, 13999).n == 8 and trial8[8].first == trial8[8].end == 14000  # phase 9 only by --phase
    assert "phase 9 (steps 14000-15200, own warm-up and cosine from lr 0.0004" in train.__doc__


def test_gpu_train_script_dry_runs_on_cpu_and_resumes(tmp_path):
    """bench/tiny/gpu_train.sh with DEVICE=cpu: one phase-9 step from the bundled weights into $OUT, then
    --resume continues at the next step from the state in $WORK (the loss log gains exactly that step)."""
    import os
    import subprocess
    import sys

    from dllm.model.loader import load_model

    root = Path(__file__).resolve().parents[1]
    out, work = tmp_path / "out", tmp_path / "work"
    env = os.environ | {"OUT": str(out), "WORK": str(work), "DEVICE": "cpu", "PYTHON": sys.executable}
    small = ["--no-bf16", "--window", "256", "--token-budget", "256", "--threads", "1"]
    script = str(root / "bench" / "tiny" / "gpu_train.sh")
    for stop, extra in ((14001, []), (14002, ["--resume"])):
        done = subprocess.run(["bash", script, "--stop-at", str(stop), *small, *extra], env=env, capture_output=True,
                              text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    rows = list(csv.reader((out / "loss.csv").open()))
    assert [(r[0], r[1], r[2]) for r in rows] == [("14000", "9", "256"), ("14001", "9", "256")]
    assert "resumed at step 14001" in (out / "train.log").read_text()
    tuned, bundled = load_model(str(out / "model")), load_model(str(root / "dllm" / "assets" / "tiny-dream"))
    a, b = tuned.state_dict(), bundled.state_dict()
    assert a.keys() == b.keys()
    diff = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    assert 0 < diff < 0.05  # two small warm-up steps away from the phase-7 weights
    # the fine-tune keeps the bundled inference defaults (chunk size, K rule): the library's would read it badly
    bundled_cfg = (root / "dllm" / "assets" / "tiny-dream" / "prefilling_config.json").read_text()
    assert (out / "model" / "prefilling_config.json").read_text() == bundled_cfg


def test_size_flags_train_a_model_of_that_shape_and_init_keeps_its_own(tmp_path):
    """--hidden-size/--layers/--heads/--kv-heads/--intermediate-size size a model trained from scratch; the
    checkpoint written says so and loads; a size flag against an --init checkpoint's is an error."""
    import json

    from dllm.model.loader import load_model

    out, work = tmp_path / "out", tmp_path / "work"
    size = ["--hidden-size", "96", "--layers", "2", "--heads", "6", "--kv-heads", "3", "--intermediate-size", "160"]
    small = ["--no-bf16", "--window", "256", "--token-budget", "256", "--threads", "1", "--stop-at", "1"]

    def run(*extra):
        threads = torch.get_num_threads()
        try:
            with torch.random.fork_rng():  # train seeds torch's global generator and sets its thread count
                return train.main(["--out", str(out), "--work", str(work), *small, *extra])
        finally:
            torch.set_num_threads(threads)

    assert run(*size, "--save-every", "1") == 0
    assert not (out / "prefilling_config.json").exists()  # from scratch: no initial checkpoint's to keep
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]) == (96, 2, 6)
    assert (cfg["num_key_value_heads"], cfg["intermediate_size"], cfg["max_window_layers"]) == (3, 160, 2)
    model = load_model(str(out))
    c = model.config
    assert (c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (96, 2, 6, 3, 16)
    # parameters of a Dream layer by hand: q/k/v with bias, o without, SwiGLU, two RMSNorms
    d, f, kv, v = 96, 160, 3 * 16, cfg["vocab_size"]
    layer = (d * d + d) + 2 * (d * kv + kv) + d * d + 3 * d * f + 2 * d
    assert sum(p.numel() for p in model.parameters()) == 2 * layer + 2 * v * d + d
    assert train.arch_of(parse_args(["--init", str(out)]))["hidden_size"] == 96  # --init's size
    with pytest.raises(train.SizeError, match="--layers 4 differs from --init's num_hidden_layers 2"):
        train.arch_of(parse_args(["--init", str(out), "--layers", "4"]))
    for flags, message in (
        (["--hidden-size", "100", "--heads", "8"], "even head dimension"),  # 100 / 8 is not whole
        (["--hidden-size", "24", "--heads", "8", "--kv-heads", "2"], "even head dimension"),  # D = 3
        (["--heads", "8", "--kv-heads", "3"], "--kv-heads 3 must divide --heads 8"),
        (["--heads", "0"], "--heads must be at least 1"),
        (["--init", str(tmp_path / "nowhere")], "has no config.json"),
    ):
        with pytest.raises(train.SizeError, match=message):
            train.arch_of(parse_args(flags))
    # a resumed run keeps the size it was trained at (saved in train_state.pt), flags or none
    (out / "config.json").unlink()
    assert run("--resume", "--stop-at", "2") == 0
    assert json.loads((out / "config.json").read_text())["hidden_size"] == 96
    assert run("--resume", "--stop-at", "3", "--layers", "3") == 2  # against the saved size: one error line
