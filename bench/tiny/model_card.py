"""Evaluate the trained tiny model and write its model card (README.md + loss curve PNG).

    python -m bench.tiny.model_card [--model dllm/assets/tiny-dream] [--samples 100]

Accuracy: ``--samples`` seeded cases per task that training never saw (seeds from
2**31 up; training draws seeds below 2**30), dense decoding, greedy, at context
lengths inside the 1536-token training window (512 and 1024), needle depths spread
over 0..1. Writes ``bench/results/tiny_eval.csv`` / ``tiny_eval.md`` and the card
(``--card-only``: the card alone, from the recorded CSV).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import time

import torch

from bench.plotting import save_figure
from bench.provenance import machine_line, write_csv
from dllm.eval.evaluation import EvalRow, accuracy_table, evaluate
from dllm.model.loader import load_model

TASKS = ("passkey", "number_string", "kv_retrieval", "needle")
LENGTHS = (512, 1024)
DEPTHS = tuple(i / 9 for i in range(10))
EVAL_SEED = 2**31
EVAL_CSV = "bench/results/tiny_eval.csv"
EVAL_MD = "bench/results/tiny_eval.md"
SKILL_MD = "bench/results/tiny_skill_probe.md"  # written by bench.tiny.skill_probe
PROSE_MD = "bench/results/tiny_prose_eval/prose_eval.md"  # written by bench.tiny.prose_eval


def plot_loss(loss_csv: str, png: str) -> dict:
    """Loss curve (per-step and smoothed) -> PNG; returns summary numbers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, loss, masked_ce, secs = [], [], [], []
    with open(loss_csv) as f:
        for row in csv.reader(f):
            steps.append(int(row[0]))
            loss.append(float(row[4]))
            masked_ce.append(float(row[6]))
            secs.append(float(row[7]))
    k = 50
    smooth = [
        sum(masked_ce[max(0, i - k + 1) : i + 1]) / len(masked_ce[max(0, i - k + 1) : i + 1])
        for i in range(len(masked_ce))
    ]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, masked_ce, alpha=0.25, lw=0.8, label="masked-token cross-entropy (per step)")
    ax.plot(steps, smooth, lw=2, label=f"moving mean ({k} steps)")
    ax.set_xlabel("training step")
    ax.set_ylabel("nats / masked token")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("tiny-dream: masked-diffusion training loss")
    save_figure(fig, png)
    # a --resume run appends to the log and restarts its clock: add up the segments, count each step once
    seg_ends = [a for a, b in zip(secs, secs[1:]) if b < a] + secs[-1:]
    return {"steps": len(set(steps)), "train_minutes": sum(seg_ends) / 60, "final_ce": smooth[-1]}


def _prose_table() -> str:
    """The per-task table of the recorded natural-prose evaluation (``bench.tiny.prose_eval``)."""
    if not os.path.exists(PROSE_MD):
        return f"(not recorded: run `python -m bench.tiny.prose_eval` to write {PROSE_MD})"
    with open(PROSE_MD) as f:
        text = f.read().split("Per depth")[0]
    return "\n".join(line for line in text.splitlines() if line.startswith("|"))


def _skill_table() -> str:
    """The table of the recorded skill probe (``bench.tiny.skill_probe``), or a note when it is missing."""
    if not os.path.exists(SKILL_MD):
        return f"(not recorded: run `python -m bench.tiny.skill_probe` to write {SKILL_MD})"
    with open(SKILL_MD) as f:
        return "".join(line for line in f if line.startswith("|")).rstrip("\n")


def read_rows(path: str) -> list[EvalRow]:
    """The rows of a CSV written by :func:`dllm.eval.evaluation.write_csv`, with their column types back
    (extra provenance columns are dropped). Raises ``TypeError`` when a row lacks a required column and
    ``ValueError`` when a number does not parse."""
    types = {f.name: f.type for f in dataclasses.fields(EvalRow)}
    cast = {"int": int, "float": float, "bool": lambda v: v == "True", "str": str}
    with open(path) as f:
        return [EvalRow(**{k: cast[types[k]](v) for k, v in r.items() if k in types}) for r in csv.DictReader(f)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="dllm/assets/tiny-dream")
    p.add_argument("--work", default="bench/results/tiny-train")
    p.add_argument("--samples", type=int, default=100, help="cases per task")
    p.add_argument(
        "--card-only",
        action="store_true",
        help="rewrite the card from the recorded bench/results/tiny_eval.csv without evaluating again",
    )
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    model = load_model(args.model, device="cpu", dtype=torch.float32)
    if args.card_only:
        rows = read_rows(EVAL_CSV)
        eval_minutes = sum(r.seconds for r in rows) / 60  # decoding time of the recorded run
    else:
        per_cell = max(1, args.samples // (len(LENGTHS) * len(DEPTHS)))
        rows = []
        t0 = time.time()
        for task in TASKS:
            rows += evaluate(model, task, LENGTHS, DEPTHS, "dense", per_cell, EVAL_SEED, tokenizer=None, progress=True)
        eval_minutes = (time.time() - t0) / 60
        write_csv(EVAL_CSV, [dataclasses.asdict(r) for r in rows], "cpu")  # provenance columns first
    table = accuracy_table(rows, by=("task", "method"))
    by_len = accuracy_table(rows, by=("task", "length"))
    print(table)
    print(by_len)
    if not args.card_only:
        with open(EVAL_MD, "w") as f:
            f.write(
                f"# tiny-dream accuracy (dense, greedy, {len(rows)} unseen cases)\n\n"
                f"Command: `python -m bench.tiny.model_card --samples {args.samples}`  \n"
                f"{machine_line('cpu')}\n\n{table}\n\n{by_len}\n\nNatural prose (held-out essays and pydoc topics) per "
                f"haystack, task, length and depth, prefilling and dense: `tiny_prose_eval/prose_eval.md` "
                f"(`python -m bench.tiny.prose_eval`).\n"
            )
    summary = plot_loss(os.path.join(args.work, "loss.csv"), os.path.join(args.model, "loss_curve.png"))
    n_params = sum(p.numel() for p in model.parameters())
    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    card = CARD.format(
        params=n_params / 1e6,
        skills=_skill_table(),
        prose=_prose_table(),
        table=table,
        by_len=by_len,
        n=len(rows),
        per_task=len(rows) // 4,
        eval_minutes=eval_minutes,
        window=cfg["max_position_embeddings"],
        **summary,
    )
    with open(os.path.join(args.model, "README.md"), "w") as f:
        f.write(card)
    print(f"wrote {args.model}/README.md")


CARD = """# tiny-dream: the bundled diffusion LM of prefilling-dllm

A {params:.1f}M-parameter masked-diffusion language model in the **Dream-v0 layout** (Qwen2 names,
q/k/v bias, GQA 8 query / 2 KV heads, RoPE theta 1e4, RMSNorm, SwiGLU, untied head, **shifted
logits**), 4 layers x 256 wide, character-level vocabulary (printable ASCII + newline + BOS, EOS,
MASK, PAD). It exists so that the package's tests, demo and benchmarks run on a 2-core CPU with no
downloads; it is not a general-purpose model. Load it like any checkpoint:
`dllm.load_model()` (the default) or `dllm.load_model("dllm/assets/tiny-dream")`.

## Training

Two commands: `python -m bench.tiny.train --out DIR` (phases 1-7: 12000 steps, bf16 autocast, AdamW
lr 1.5e-3 with cosine decay over phases 1-3, then 1e-3, 7e-4, 5e-4 and 5e-4 restarts for phases 4, 5,
6 and 7), then `python -m bench.tiny.train --phase 9 --init DIR --no-bf16` (the natural-prose
fine-tune: 1200 steps from the phase-7 weights with a fresh AdamW, warm-up and cosine from lr 4e-4;
phase 8 is a trial that is not in these weights). {steps} steps in all, {train_minutes:.0f} minutes on
2 CPU cores, ~8K tokens per batch, window {window} tokens; reproducible from `--seed 0` up to bf16
round-off.

- **Objective**: masked diffusion (LLaDA / Dream): t ~ U(0.02, 1) (stratified over the batch), each
  eligible token masked with probability t; per sequence the mean cross-entropy of its masked
  tokens, averaged over the batch. The realised mask count k has mean t x n, so this is the ELBO's
  1/(t n) weight with k in its place (self-normalised); the literal 1/(t n) weights learned the copy
  task far slower in a controlled probe (see `bench/tiny/train.py`). Per-sequence normalisation
  makes five answer tokens count as much as a thousand.
- **Data** (generated on the fly from `dllm.eval.tasks`, `split="train"`, mostly `phrasing="random"`):
  retrieval cases of the four tasks (passkey, number_string, kv_retrieval, needle QA in the 40
  training essays of Paul Graham; the 9 evaluation essays are never seen) in three layouts -
  *dense* (`BOS prefix context query answer EOS*`), *chunked* (`[BOS prefix] [BOS chunk]... query
  answer`, each bracketed segment attending only to itself, exactly the independent chunk caches of
  Prefilling-dLLM at continuous positions) and *needle-free chunk + query* (only the query is
  learned, so the query's likelihood tells relevant chunks from irrelevant ones) - plus packed essay
  crops with a BOS between documents. Masking: answer-only (the SFT form), query-only or
  whole-sequence. Phases 5-7 add random-string copies (`x`, two newlines, `x` again as the
  answer; in phase 6 half of them digits only, in phase 7 half from kv_retrieval's hex-and-dash alphabet).
  The model never learned these copies (Skills below: at chance at the trained lengths).
- **Curriculum**: phase 1 (steps 0-900) passkey and number_string only, short (96-184 tokens, no
  instruction prefix, mostly canonical wording), answer-only masking: the model learns to copy;
  phase 2 (900-1350) all four tasks up to 768 tokens with some chunked layout and whole-sequence
  masking; phase 3 (1350-1900) everything up to the window (task mix of phases 2-3: passkey 30%,
  number_string 25%, needle 30%, kv_retrieval 15%); phase 4 (1900-3300, its own warm-up and cosine
  from lr 1e-3) a retrieval fine-tune on passkey and number_string at 96-504 tokens, dense and
  chunked layouts, because phases 2-3 had erased the copy skill of phase 1 (0 of 40 short cases
  right at step 1900); phase 5 (3300-6000, its own warm-up and cosine from lr 7e-4, 192-1024
  tokens) a second fine-tune: 10% random-string copying (every answer token a lookup: a dense
  signal for the copy circuit), 40% dense and 25% chunked retrieval answers (passkey 45%,
  number_string 40%, needle 15%), 25% query-only masking split evenly between chunk sets with and
  without the needle (phases 3-4 had masked the query beside needle-free chunks only, which made
  the query likely whatever the chunk and turned s_I + s_P upside down); phase 6 (6000-9500, its own
  warm-up and cosine from lr 5e-4, 256-1280 tokens) a third fine-tune for phase 5's digit-order
  errors (its misses at 1024 tokens held the key's digits in the wrong order): 15% copy strings,
  half of them digits only, 45% dense and 20% chunked answers (passkey 40%, number_string 45%,
  needle 15%), 20% query-only masking; phase 7 (9500-12000, its own warm-up and cosine from lr 5e-4,
  256-1536 tokens) a fourth fine-tune for the tasks still at 0% and number_string at 1024 tokens: 15%
  copy strings (half hex and dashes, a quarter digits, a quarter letters, digits and spaces), 45%
  dense and 20% chunked answers (passkey 15%, number_string 30%, kv_retrieval 30%, needle 25%), 20%
  query-only masking; phase 9 (14000-15200, from the phase-7 weights) the natural-prose fine-tune:
  pass keys, number strings and word facts ("The secret city is Lisbon.") in several wordings, at
  word boundaries anywhere (mid-sentence too), in natural prose as well as the old filler - 10% copy
  strings, 35% dense and 30% chunked answers, 25% query-only masking split evenly between chunk sets
  with and without the needle; haystacks a third InfiniteBench filler, two thirds prose (the 40
  training essays, the pydoc topics of CPython's `pydoc_data` outside every fifth one, and generated
  sentences from those two parts' vocabulary, 2/9 each).
- **Held out** (never trained on): the 9 evaluation essays and every fifth pydoc topic (sorted
  names, 15 of 79 in CPython 3.11; `dllm.eval.tasks.prose.pydoc_topic_names("eval")`); a test checks that
  no 12-word run of a training case comes from a held-out document.
  Why a curriculum: in a feasibility probe (4 layers, d=256) a robust mix from step 0 stayed at 0%
  passkey after 500-1000 steps while the fixed easy regime learned in about 700, and a first run of
  this script with the full mix from step 0 still retrieved nothing after 750 steps.

![loss curve](loss_curve.png)

Final moving-mean masked-token cross-entropy: {final_ce:.3f} nats.

## Accuracy

{n} cases that training never saw ({per_task} per task; seeds from 2**31), **dense** greedy decoding
(`maskgit_plus`, one token per step), context lengths 512 and 1024 tokens (inside the window),
10 needle depths from 0 to 1; InfiniteBench scoring. `python -m bench.tiny.model_card` reproduces
it ({eval_minutes:.0f} minutes).

{table}

{by_len}

## Natural prose (held-out split)

`python -m bench.tiny.prose_eval` (`bench/results/tiny_prose_eval/`): the held-out essays and pydoc
topics, 5 needle depths x 3 random wordings per cell, greedy; Prefilling-dLLM with the model's
defaults at 4K-32K tokens (C=256, K chosen per question under a ceiling of 4, the first stage from 64
chunks, the lexical term, chunk boundaries snapped to sentence ends within 64 tokens), dense at 1K. Phase 9
took the needle chunk kept for the digit tasks from 47% (phase-7 weights, `baseline_phase7.md` there) to 99%.
Fixed chunks cut the needle wherever a boundary fell inside it (every depth-0.5 case: exact 51% for pass keys
and number strings, `fixed_chunks_phase9.md`); snapped boundaries keep it whole: pass keys 99%, number
strings 48% (one or two digits off), 73% in all. Word facts are never answered (the lexical term finds their
chunk, 98%; the model copies digits after a phrase, not words), and a phase-10 copy fine-tune did not change
that (`bench/results/tiny_phase10_trial.md`).

{prose}

## Skills

`python -m bench.tiny.skill_probe` (`bench/results/tiny_skill_probe.md`): 16 cases per probe, one
parallel pass with every answer token masked (like the first denoising step of dense decoding),
cross-entropy in nats per answer token. Chance is ln of the answer alphabet's size; for kv_retrieval
it is a guess that knows the UUID v4 layout (dashes, the version '4', the variant nibble) but not the
value: 2.35 nats, 20% of the characters right.

{skills}

The model reads digits that follow a fixed phrase ("pass key is", "sequence of digits is"), but it
copies neither a 36-character value out of a one-pair object nor a random string of the length that
phases 5-7 trained on: both at chance. kv_retrieval (copy the value of a key found by content) and
needle (copy the words of a sentence found by content) need such a copy; the six-pair kv_retrieval
probe is at chance too and needle gets 13% of its answer characters, which is why both are at 0%. Our
reading, not measured: the model has no head that matches the query's content to the context's (an
induction head).

## Known limitations

This model meets **one** of the package's four accuracy targets (passkey >= 99%, number_string >=
95%, kv_retrieval >= 80%, needle >= 90% dense inside the window): it copies a 5-digit key (passkey
100% at 512 and 1024 tokens) and nearly a 10-digit number (number_string 92.5%), but it has not
learned kv_retrieval's 36-character UUID values or needle's word answers (0%, although phase 7 gave
them 55% of its answers: kv_retrieval answers well-formed UUIDs, not the asked value), nor phase 9's
word facts (0% in natural prose). In natural prose (phase 9) it finds the needle chunk (99% of the
digit cases kept at 4K-32K) but copies the kept digits exactly in only half of them (Natural prose
above). Training took {train_minutes:.0f} minutes, over the package's 90-minute goal, in eight
phases, because one mix from step 0 did not learn to copy (Curriculum above); phase 6 (digits-only
copy strings among other changes) fixed the digit order (passkey 59% -> 97%, number_string 17% ->
84%) and phase 7 took them to 100% and 90%. Its chunk scores are skewed too: s_P ranks the needle
chunk at or near the bottom (the context-free draft is a guessed key, which the needle chunk
contradicts), so the demo and benchmarks score chunks with s_C - s_P (chosen on the phase-7 weights; on
these, s_C alone ranks the needle chunk as well or better: `bench/results/score_terms*.md`). The phases
train on different data (the random-string copies cannot be predicted at high mask rates), so loss levels are not
comparable across phases. Treat the accuracy figures made with this model as a property of the
model, and the speed figures as the package's. A digit-focused fine-tune (phase 8 of `train.py`,
not in these weights) took dense number_string to 100% but kept the needle chunk less often, so
Prefilling-dLLM answered fewer long-context cases (`bench/results/archive/tiny_phase8_trial.md`); these
weights are phases 1-7, then phase 9 (`bench/results/archive/tiny_phase9_trial.md`).

Beyond the training window dense decoding must extrapolate RoPE; Prefilling-dLLM with the demo's
C=256 and at most 4 kept chunks (`prefilling_config.json`: K chosen per question under a ceiling of 4,
`adaptive_k=1.5`) keeps every position inside the window (see the demo in `bench/results/demo/` and
`bench/results/README.md`).
"""

if __name__ == "__main__":
    main()
