"""Train the bundled tiny Dream-layout dLLM with the masked-diffusion objective.

    python -m bench.tiny.train --out dllm/assets/tiny-dream

Model: Dream/Qwen2 layout (shifted logits, GQA 8/2 heads, RoPE, q/k/v bias,
SwiGLU, untied head), 4 layers x 256 wide, ~2.9M parameters, character-level
vocabulary; ``--hidden-size``, ``--layers``, ``--heads``, ``--kv-heads`` and
``--intermediate-size`` size a model trained from scratch (with ``--init`` the checkpoint's
size is kept: :func:`arch_of`). Objective (LLaDA / Dream masked diffusion): draw t ~ U(t_min, 1),
mask each eligible token with probability t, predict the masked tokens. Per-sequence
loss = mean cross-entropy over the sequence's masked tokens, then mean over the batch:
each sequence weighs the same however few answer tokens it has (a batch-mean loss drowned
the few answer tokens under whole-sequence rows in a feasibility probe), and
since the realised mask count k has mean t * n this is the ELBO's 1/(t n) weight with
k in place of t n (self-normalised). The literal 1/(t n) weights (``--weighting elbo``)
learned the copy task far slower in a controlled probe (short passkey cases, bf16,
lr 1.5e-3: digit cross-entropy 2.07 nats after 150 steps with stratified t, ~2.3 with
i.i.d. t, against 1.72 with the per-row mean; chance is ln 10 = 2.30).

Curriculum: one row of :data:`PHASES` per phase (its steps, peak learning rate, length
buckets and sample mix); the schedule, the ``--phaseN`` / ``--lrN`` flags and the list
below come from that table. A robust mix from step 0 did not learn in a feasibility probe
(0% passkey after 500-1000 steps, against ~700 steps in the fixed easy regime); a first
run of this script with the mix from step 0 still retrieved nothing after 750 steps. A phase
with a peak lr starts its own warm-up and cosine decay (to 10% of the
peak) over itself and the phases after it that have none. Layouts (``bench.tiny.data``):
dense ``BOS prompt answer``; chunked ``[BOS chunk]... query answer`` with segment-local
attention (Prefilling-dLLM's chunk caches); query-only masking beside chunks with or
without the needle (the training signal of the s_I chunk score); copy strings; packed essays; chunked
answers among number-dense chunks (``bench.tiny.distractors``).

{phases}

Reproducible from ``--seed`` (CPU, 2 threads) up to bf16 round-off: a resumed segment repeats the same
data with loss values equal to about 1e-3.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bench.tiny import data, distractors
from bench.tiny.tokenizer import SPECIALS, save_char_tokenizer
from dllm.model.config import ModelConfig
from dllm.model.modeling import DiffusionLM
from dllm.model.weights import save_checkpoint

ARCH = dict(
    hidden_size=256,
    intermediate_size=704,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
)


# the flags that size a model trained from scratch (--init takes the size of its checkpoint)
ARCH_FLAGS = {
    "hidden_size": "--hidden-size",
    "intermediate_size": "--intermediate-size",
    "num_hidden_layers": "--layers",
    "num_attention_heads": "--heads",
    "num_key_value_heads": "--kv-heads",
}


class SizeError(ValueError):
    """A model size that cannot be trained (bad widths, or flags against --init's or --resume's size)."""


def arch_of(args, saved: dict | None = None) -> dict:
    """The architecture to train: :data:`ARCH`, then the ``--init`` checkpoint's sizes or the ``saved`` ones of
    a resumed run (``train_state.pt``), then the size flags, which must agree with those.

    Raises:
        SizeError: a size flag that contradicts --init's or the resumed run's size, an --init folder without
            a config.json, a width below 1, a hidden size that the query heads do not divide into an even
            head dimension (RoPE rotates pairs), or query heads that the KV heads do not divide.
    """
    arch = dict(ARCH)
    given, source = {}, ""
    if saved:
        given, source = {k: v for k, v in saved.items() if k in ARCH}, "the resumed run's"
    elif getattr(args, "init", None):
        path = os.path.join(args.init, "config.json")
        if not os.path.isfile(path):
            raise SizeError(f"--init {args.init} has no config.json")
        with open(path) as f:
            given, source = {k: v for k, v in json.load(f).items() if k in ARCH}, "--init's"
    arch |= given
    for key, flag in ARCH_FLAGS.items():
        value = getattr(args, key, None)
        if value is None:
            continue
        if value < 1:
            raise SizeError(f"{flag} must be at least 1, got {value}")
        if key in given and given[key] != value:
            raise SizeError(f"{flag} {value} differs from {source} {key} {given[key]}")
        arch[key] = value
    d, hq, hkv = arch["hidden_size"], arch["num_attention_heads"], arch["num_key_value_heads"]
    if d % hq or (d // hq) % 2:
        raise SizeError(f"--heads {hq} must divide --hidden-size {d} into an even head dimension (RoPE)")
    if hq % hkv:
        raise SizeError(f"--kv-heads {hkv} must divide --heads {hq}")
    return arch


def dream_config_json(vocab_size: int, window: int, arch: dict = ARCH) -> dict:
    """config.json in Dream-v0's own format (same fields as tests/data/reference/dream-v0-7b)."""
    return {
        "architectures": ["DreamModel"],
        "model_type": "Dream",
        "attention_dropout": 0.0,
        "bos_token_id": data.BOS,
        "eos_token_id": data.EOS,
        "pad_token_id": data.PAD,
        "mask_token_id": data.MASK,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "max_position_embeddings": window,
        "max_window_layers": arch["num_hidden_layers"],
        "rope_scaling": None,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "use_mrope": False,
        "use_sliding_window": False,
        "vocab_size": vocab_size,
        **arch,
    }


def model_config(vocab_size: int, arch: dict = ARCH) -> ModelConfig:
    return ModelConfig(
        family="dream",
        vocab_size=vocab_size,
        hidden_size=arch["hidden_size"],
        intermediate_size=arch["intermediate_size"],
        num_layers=arch["num_hidden_layers"],
        num_heads=arch["num_attention_heads"],
        num_kv_heads=arch["num_key_value_heads"],
        head_dim=arch["hidden_size"] // arch["num_attention_heads"],
        rope_theta=arch["rope_theta"],
        rms_norm_eps=arch["rms_norm_eps"],
        qkv_bias=True,
        tie_word_embeddings=False,
        shift_logits=True,
        mask_token_id=data.MASK,
        bos_token_id=data.BOS,
        eos_token_id=data.EOS,
        pad_token_id=data.PAD,
    )


# ---- the curriculum -----------------------------------------------------------------------------------

TASK_WEIGHTS = {"passkey": 0.3, "number_string": 0.25, "kv_retrieval": 0.15, "needle": 0.3}
POOL_NAMES = {data.COPY_POOL: "letters, digits and spaces", data.DIGIT_POOL: "digits", data.HEX_POOL: "hex and dash"}


@dataclass(frozen=True)
class Layout:
    """One kind of sample in a phase's mix (``bench.tiny.data`` builds it).

    kind: "dense", "chunked" (both with the answer), "query" (chunks and query, only the query
    masked), "copy" (a random string and its copy), "essays" (packed text, all masked) or
    "distractors" (chunked answers with number-dense chunks beside the needle's:
    ``bench.tiny.distractors``; answer-only masking).
    tasks: task weights drawn for this layout (None: the task the phase drew before the layout).
    canonical, prefix: dense only: probability of the canonical wording and of the instruction prefix.
    max_eos: dense only: most EOS tokens after the answer.
    answer_only: dense / chunked: probability of answer-only masking, else whole-sequence masking.
    needle: query only: the chunk set holds the needle chunk (True) or is needle-free.
    pools: copy only: ((alphabet, weight), ...); empty: ``data.COPY_POOL``.
    haystacks: dense / chunked / query / distractors: ((haystack, weight), ...) of ``make_case``'s haystacks,
    drawn after the wording; empty: the task's own filler (no draw).
    A probability of 0 or 1 draws nothing from the rng (as the committed run drew).
    """

    kind: str
    tasks: dict | None = None
    canonical: float = 0.0
    prefix: float = 1.0
    max_eos: int = 12
    answer_only: float = 1.0
    needle: bool = False
    pools: tuple = ()
    haystacks: tuple = ()


@dataclass(frozen=True)
class Phase:
    """One training phase: steps ``[first, end)`` with the default flags (``--phaseN`` moves the end),
    ``lr`` = (peak learning rate, warm-up steps) of its own warm-up and cosine (None: it continues the
    previous phase's), batch length buckets (tokens), sample mix, and why the phase exists.

    ``mix`` is ((u_below, Layout), ...): one uniform draw u picks the first layout with u < u_below
    (cumulative thresholds, so the draws match the committed run bit for bit); a one-layout mix
    draws no u. ``tasks`` (task -> weight) is drawn before u; None: each layout draws its own.
    """

    first: int
    end: int
    lr: tuple[float, int] | None
    buckets: tuple[int, ...]
    mix: tuple[tuple[float, Layout], ...]
    tasks: dict | None
    why: str
    trial: bool = (
        False  # not in the default run: only when --steps goes past the phase before it, or alone with --phase N
    )


CHUNKED, ESSAYS = Layout("chunked"), Layout("essays")
QUERY_NO_NEEDLE = Layout("query")


def fine_tune(copy, dense, chunked, no_needle, answer_tasks, pools=()) -> tuple[tuple[float, Layout], ...]:
    """The mix of the late fine-tunes from its cumulative thresholds: copy strings, dense answers (half
    canonical wording, 60% with the prefix), chunked answers, then query-only masking beside the needle
    chunk and beside needle-free chunks (those tasks from :data:`TASK_WEIGHTS`)."""
    return (
        (copy, Layout("copy", pools=pools)),
        (dense, Layout("dense", tasks=answer_tasks, canonical=0.5, prefix=0.6, max_eos=6)),
        (chunked, Layout("chunked", tasks=answer_tasks)),
        (no_needle, Layout("query", tasks=TASK_WEIGHTS, needle=True)),
        (1.0, Layout("query", tasks=TASK_WEIGHTS)),
    )


PROSE_STEPS = 1200
PROSE_TASKS = {"passkey": 0.4, "number_string": 0.3, "word_fact": 0.3}
PROSE_MIX = (("filler", 1 / 3), ("essays", 2 / 9), ("pydoc", 2 / 9), ("generated", 2 / 9))


def _prose_layouts(cuts, answer_tasks: dict, digit_share: float) -> tuple[tuple[float, Layout], ...]:
    """The prose phases' mix from its cumulative thresholds ``(copy, dense, chunked, beside the needle)``:
    copy strings (``digit_share`` of them digits only, the rest letters, digits and spaces), dense and
    chunked answers on ``answer_tasks``, then query-only masking beside the needle chunk and beside
    needle-free chunks (:data:`PROSE_TASKS`); every retrieval layout over :data:`PROSE_MIX`."""
    copy, dense, chunked, needle = cuts
    pools = ((data.DIGIT_POOL, digit_share), (data.COPY_POOL, 1 - digit_share))
    return (
        (copy, Layout("copy", pools=pools)),
        (dense, Layout("dense", tasks=answer_tasks, canonical=0.4, prefix=0.6, max_eos=6, haystacks=PROSE_MIX)),
        (chunked, Layout("chunked", tasks=answer_tasks, haystacks=PROSE_MIX)),
        (needle, Layout("query", tasks=PROSE_TASKS, needle=True, haystacks=PROSE_MIX)),
        (1.0, Layout("query", tasks=PROSE_TASKS, haystacks=PROSE_MIX)),
    )


def prose_tune() -> tuple[tuple[float, Layout], ...]:
    """Phase 9's mix: 10% copy strings, 35% dense and 30% chunked answers, 12.5% query-only beside the
    needle chunk and 12.5% beside needle-free chunks, every retrieval layout over :data:`PROSE_MIX`."""
    return _prose_layouts((0.1, 0.45, 0.75, 0.875), PROSE_TASKS, 0.5)


COPY_STEPS = 1500
COPY_TASKS = {"passkey": 0.2, "number_string": 0.45, "word_fact": 0.35}


def copy_tune() -> tuple[tuple[float, Layout], ...]:
    """Phase 10's mix: phase 9's layouts re-weighted towards copying an answer out of static chunk KV
    (the layout of Prefilling-dLLM's decode): 10% copy strings (60% digits only), 25% dense and 35% chunked
    answers weighted to number strings and word facts (:data:`COPY_TASKS`), and 15% + 15% query-only
    masking beside chunk sets with and without the needle, so that the selection signal is kept."""
    return _prose_layouts((0.1, 0.35, 0.7, 0.85), COPY_TASKS, 0.6)


WORD_STEPS = 1000
WORD_TASKS = {"word_fact": 0.6, "number_string": 0.25, "passkey": 0.15}


def word_tune() -> tuple[tuple[float, Layout], ...]:
    """Phase 11's mix: phase 9's layouts on short contexts, weighted to word facts (:data:`WORD_TASKS`):
    10% copy strings (letters and digits), 45% dense and 25% chunked answers, 10% + 10% query-only masking
    beside chunk sets with and without the needle."""
    return _prose_layouts((0.1, 0.55, 0.8, 0.9), WORD_TASKS, 0.3)


DISTRACTOR_STEPS = 340
DISTRACTOR_TASKS = {"passkey": 0.4, "number_string": 0.6}


def distractor_tune() -> tuple[tuple[float, Layout], ...]:
    """Phase 12's mix: 40% chunked answers among number-dense chunks (``bench.tiny.distractors``: 2-5
    chunks, the needle's at any place, the others reports, tables or prose with dates, amounts and codes put
    in; :data:`DISTRACTOR_TASKS` in the haystacks of :data:`PROSE_MIX`), then phase 9's layouts: 5% copy
    strings (half digits only), 15% dense and 15% chunked answers (:data:`PROSE_TASKS`), and phase 9's
    12.5% + 12.5% query-only masking beside chunk sets with and without the needle (the selection signal)."""
    new = (0.4, Layout("distractors", tasks=DISTRACTOR_TASKS, haystacks=PROSE_MIX))
    return (new, *_prose_layouts((0.45, 0.6, 0.75, 0.875), PROSE_TASKS, 0.5))


# Batch shapes come from a few buckets: CPU matmul kernels (oneDNN) are built per shape, and a new
# shape every step cost 2-4 s of a ~1.5 s step in a probe.
PHASES: tuple[Phase, ...] = (
    Phase(0, 900, (1.5e-3, 100), (192,),
          mix=((1.0, Layout("dense", canonical=0.7, prefix=0.0, max_eos=3)),),
          tasks={"passkey": 0.6, "number_string": 0.4},
          why="copying: the copy circuit forms faster when the needle is near the query and the wording is "
          "fixed (the same recipe at 192-384 tokens was still at chance after 300 steps; and 700 steps of it "
          "were not enough: the half-formed skill was lost when phase 2 began)"),
    Phase(900, 1350, None, (256, 384, 512, 640, 768),
          mix=((0.8, Layout("dense", answer_only=0.85)), (0.95, CHUNKED), (1.0, ESSAYS)),
          tasks=TASK_WEIGHTS,
          why="all four tasks, some chunked layout, some whole-sequence masking"),
    Phase(1350, 1900, None, (256, 384, 512, 768, 1024, 1280, 1536),
          mix=((0.4, Layout("dense", answer_only=0.8)), (0.75, Layout("chunked", answer_only=0.85)),
               (0.85, QUERY_NO_NEEDLE), (1.0, ESSAYS)),
          tasks=TASK_WEIGHTS,
          why="lengths up to the window, the chunked layout, needle-free chunks and packed essays"),
    Phase(1900, 3300, (1e-3, 50), (192, 256, 384, 512),
          mix=((0.45, Layout("dense", canonical=0.6, prefix=0.5, max_eos=3)), (0.9, CHUNKED),
               (1.0, QUERY_NO_NEEDLE)),
          tasks={"passkey": 0.5, "number_string": 0.5},
          why="a retrieval fine-tune: in the run that made the bundled model, the copy skill of phase 1 (digit "
          "cross-entropy with every answer digit masked: 0.89 nats on 150-token passkey cases at step 600, flat "
          "to step 900; chance is 2.30) was gone by step 1400 (1.54) and the model retrieved 0 of 40 short cases "
          "at step 1900"),
    Phase(3300, 6000, (7e-4, 50), (192, 256, 384, 512, 768, 1024),
          mix=fine_tune(0.1, 0.5, 0.75, 0.875, {"passkey": 0.45, "number_string": 0.4, "needle": 0.15}),
          tasks=None,
          why="a second fine-tune for what phase 4 left: copy strings (every answer token is a lookup, a dense "
          "signal for the copy circuit) and query-only masking beside chunk sets with and without the needle "
          "alike. Phases 3-4 masked the query beside needle-free chunks only, which taught the model that a "
          "query is likely whatever the context: on the phase-4 model s_I + s_P ranked the needle chunk last in "
          "10 of 10 passkey cases at 8K (s_I alone found it in 5 of 10 on the phase-5 model)"),
    Phase(6000, 9500, (5e-4, 50), (256, 512, 768, 1024, 1280),
          mix=fine_tune(0.15, 0.6, 0.8, 0.9, {"passkey": 0.4, "number_string": 0.45, "needle": 0.15},
                        pools=((data.DIGIT_POOL, 0.5), (data.COPY_POOL, 0.5))),
          tasks=None,
          why="a third fine-tune for the ordering errors phase 5 left: its passkey/number_string misses at 1024 "
          "tokens hold the key's digits in the wrong order (2883242612 -> 2883423262); digits-only copy strings "
          "(only the order tells the digits apart), and 1280-token batches so the 1024-token cases are no longer "
          "at the edge of what the model has seen"),
    Phase(9500, 12000, (5e-4, 50), (256, 512, 768, 1024, 1280, 1536),
          mix=fine_tune(0.15, 0.6, 0.8, 0.9,
                        {"passkey": 0.15, "number_string": 0.3, "kv_retrieval": 0.3, "needle": 0.25},
                        pools=((data.HEX_POOL, 0.5), (data.DIGIT_POOL, 0.25), (data.COPY_POOL, 0.25))),
          tasks=None,
          why="a fourth fine-tune for the tasks phase 6 left at 0% (kv_retrieval's 36-character UUID values, "
          "needle's word answers) and number_string at 1024 tokens; the last phase of the bundled model"),
    Phase(12000, 14000, (3e-4, 50), (512, 768, 1024, 1280, 1536),
          mix=fine_tune(0.0, 0.55, 0.85, 0.925,
                        {"passkey": 0.3, "number_string": 0.5, "kv_retrieval": 0.1, "needle": 0.1}),
          tasks=None, trial=True,
          why="a trial fifth fine-tune, NOT in the bundled model (only with --steps beyond --phase7), for the "
          "digit tasks' one-digit copy errors: no copy strings (bench.tiny.skill_probe finds copies of the phase "
          "5-7 copy strings' lengths at chance: the model never learned them). It took dense number_string to "
          "100% but made chunk selection worse (bench/results/archive/tiny_phase8_trial.md), so the default --steps "
          "stops at 12000"),
    Phase(14000, 14000 + PROSE_STEPS, (4e-4, 50), (256, 512, 768, 1024, 1280, 1536),
          mix=prose_tune(), tasks=None, trial=True,
          why="the prose fine-tune of the bundled model, run with --phase 9 --init <phase-7 "
          "checkpoint>: from the "
          "phase-7 weights (not phase 8's) with a fresh optimizer, it brings pass keys, number strings and "
          "word facts into natural prose (training essays, training pydoc topics, generated text; the "
          "evaluation essays and every fifth pydoc topic are held out) in all three layouts, with 25% "
          "query-only masking split evenly between chunk sets with and without the needle (the s_I "
          "signal phase 8 lost when it cut it to 15%), a third of each layout in the old filler, and 10% "
          "copy strings as in phases 5-7"),
    Phase(14000 + PROSE_STEPS, 14000 + PROSE_STEPS + COPY_STEPS, (3e-4, 50), (256, 512, 768, 1024, 1280, 1536),
          mix=copy_tune(), tasks=None, trial=True,
          why="the copy fine-tune of the bundled model, run with --phase 10 --init <phase-9 "
          "checkpoint>: phase 9 found the needle chunk in held-out prose (99%) but copied from it badly "
          "(exact 51%: pass keys and number strings one or two digits off, word facts 0%); from the phase-9 "
          "weights with a fresh optimizer and a lower peak, more chunked answers (the static-KV layout of "
          "the decode) on number strings and word facts, 30% query-only masking kept for the selection signal"),
    Phase(14000 + PROSE_STEPS + COPY_STEPS, 14000 + PROSE_STEPS + COPY_STEPS + WORD_STEPS, (7e-4, 50),
          (192, 256, 384, 512), mix=word_tune(), tasks=None, trial=True,
          why="the word-fact fine-tune, run with --phase 11 --init <phase-9 checkpoint>: phases 9-10 "
          "left word facts at 0% even dense at 1K (2.5 nats per answer character with every answer character "
          "masked, on training cases: the model never learned to find a word after its anchor phrase). The "
          "recipe that formed the digit lookup in phase 1: short contexts (the needle near the query), a "
          "higher peak, most samples on the missing skill"),
    Phase(14000 + PROSE_STEPS + COPY_STEPS + WORD_STEPS,
          14000 + PROSE_STEPS + COPY_STEPS + WORD_STEPS + DISTRACTOR_STEPS, (3e-4, 50),
          (512, 768, 1024, 1280, 1536), mix=distractor_tune(), tasks=None, trial=True,
          why="the distractor-chunk fine-tune, run with --phase 12 --init <phase-9 checkpoint>: on held-out "
          "prose (bench.fidelity.copy_eval, devil) the phase-9 model copied the answer from the needle's chunk "
          "alone in 74% of the cases where selection kept it, beside random unkept chunks in 61%, but beside "
          "the chunks selection kept in 17%: those hold numbers (dates, codes, amounts, section numbers; 6.6 "
          "on average) and its wrong answers were the answer with a digit or two changed, not a distractor "
          "picked. No phase trained that layout (several disjoint pieces, the needle's among chunks full of "
          "other numbers). From the phase-9 weights with a fresh optimizer and a modest peak, 40% chunked "
          "answers with number-dense chunks of training text beside the needle's (2-5 chunks, the needle's "
          "at any place), the rest phase 9's layouts with its 25% query-only masking kept whole (chunk "
          "selection's signal)"),
)  # fmt: skip
assert all(a.end == b.first for a, b in zip(PHASES, PHASES[1:])) and PHASES[0].first == 0 and PHASES[0].lr
BUNDLED_STEPS = max(p.end for p in PHASES if not p.trial)


def _lr_flag(n: int) -> str:
    return "lr" if n == 1 else f"lr{n}"


@dataclass(frozen=True)
class PhaseRun:
    """A phase as this run's flags place it: steps [first, end), in the warm-up + cosine over
    [cos_first, cos_end) that peaks at ``peak``."""

    n: int
    spec: Phase
    first: int
    end: int
    cos_first: int
    cos_end: int
    peak: float
    warmup: int

    def lr(self, step: int) -> float:
        return lr_at(step - self.cos_first, self.cos_end - self.cos_first, self.peak, warmup=self.warmup)


def schedule(args) -> list[PhaseRun]:
    """The phases with the flags applied: phase N ends at ``--phaseN`` or at ``--steps`` when that
    comes first, the last one at ``--steps``."""
    ends = [min(getattr(args, f"phase{n}"), args.steps) for n in range(1, len(PHASES))] + [args.steps]
    runs: list[PhaseRun] = []
    for i, spec in enumerate(PHASES):
        first = ends[i - 1] if i else 0
        if spec.lr is not None:  # a restart: its cosine runs to the end of the phases that continue it
            last = next((j for j in range(i + 1, len(PHASES)) if PHASES[j].lr is not None), len(PHASES)) - 1
            cos = (first, ends[last], getattr(args, _lr_flag(i + 1)), spec.lr[1])
        runs.append(PhaseRun(i + 1, spec, first, ends[i], *cos))
    return runs


def run_at(runs: list[PhaseRun], step: int) -> PhaseRun:
    """The phase that ``step`` belongs to."""
    return runs[sum(step >= r.end for r in runs[:-1])]


def lr_at(step: int, total: int, peak: float, warmup: int = 100) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine from ``peak`` to 0.1 * peak at ``total``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    p = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def _coin(rng: random.Random, p: float) -> bool:
    return p >= 1.0 or (p > 0.0 and rng.random() < p)


def _weighted(rng: random.Random, weights: dict) -> str:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def draw_sample(rng: random.Random, essays: data.EssayStream, total: int, phase: Phase) -> tuple[data.Sample, str]:
    """One sample of about ``total`` tokens and its masking mode ("answer", "query" or "all") under
    ``phase``'s mix. The draws come in a fixed order (the phase's task, u, the layout's task, wording,
    prefix, the sample, the masking), so a resumed run repeats its data."""
    task = _weighted(rng, phase.tasks) if phase.tasks else None
    u = rng.random() if len(phase.mix) > 1 else 0.0
    layout = next(lay for below, lay in phase.mix if u < below)
    if layout.tasks:
        task = _weighted(rng, layout.tasks)
    if layout.kind == "copy":
        pool = data.COPY_POOL
        if layout.pools:
            pools, weights = zip(*layout.pools)
            pool = rng.choices(pools, weights=weights)[0]
        return data.copy_sample(rng, total, pool), "answer"
    if layout.kind == "essays":
        return essays.sample(rng, total), "all"
    if layout.kind == "distractors":
        hay = _weighted(rng, dict(layout.haystacks)) if layout.haystacks else "filler"
        return distractors.distractor_chunked_sample(rng, total, task, haystack=hay), "answer"
    hay = "filler"
    if layout.haystacks and layout.kind in ("query", "chunked"):
        hay = _weighted(rng, dict(layout.haystacks))
    if layout.kind == "query":
        sample = data.chunked_sample(rng, total, task, drop_needle=not layout.needle, answer=False, haystack=hay)
        return sample, "query"
    if layout.kind == "dense":
        phrasing = "canonical" if _coin(rng, layout.canonical) else "random"
        prefix = _coin(rng, layout.prefix)
        if layout.haystacks:
            hay = _weighted(rng, dict(layout.haystacks))
        sample = data.dense_sample(rng, total, task, phrasing, prefix=prefix, max_eos=layout.max_eos, haystack=hay)
    else:
        sample = data.chunked_sample(rng, total, task, haystack=hay)
    return sample, "answer" if _coin(rng, layout.answer_only) else "all"


def draw_batch(
    rng: random.Random, essays: data.EssayStream, phase: Phase, window: int, token_budget: int
) -> tuple[int, list[data.Sample], list[str]]:
    """A batch of the phase: its length (a bucket <= ``window``), ``max(2, token_budget // length)``
    samples and their masking modes. A sample that overshoots the bucket is drawn again (answers are
    never truncated)."""
    length = rng.choice([b for b in phase.buckets if b <= window])
    pairs: list[tuple[data.Sample, str]] = []
    while len(pairs) < max(2, token_budget // length):
        total = rng.randint(max(96, length // 2), length - 8)
        sample, mode = draw_sample(rng, essays, total, phase)
        if len(sample.ids) <= length:
            pairs.append((sample, mode))
    return length, [s for s, _ in pairs], [m for _, m in pairs]


def _percent(x: float) -> str:
    return f"{round(100 * x, 1):g}%"


def _weights_text(weights: dict) -> str:
    return ", ".join(f"{k} {_percent(w)}" for k, w in weights.items())


def _layout_text(layout: Layout) -> str:
    text = {
        "dense": "dense answers",
        "chunked": "chunked answers",
        "essays": "packed essays",
        "copy": "copy strings",
        "distractors": "chunked answers among number-dense chunks",
        "query": "query-only beside the needle chunk" if layout.needle else "query-only beside needle-free chunks",
    }[layout.kind]
    notes = []
    if layout.kind == "dense":
        notes.append(f"canonical wording {_percent(layout.canonical)}, prefix {_percent(layout.prefix)}")
    if layout.answer_only < 1.0:
        notes.append(f"whole-sequence masking {_percent(1 - layout.answer_only)}")
    if layout.pools:
        notes.append(", ".join(f"{POOL_NAMES[p]} {_percent(w)}" for p, w in layout.pools))
    if layout.tasks and layout.tasks is not TASK_WEIGHTS:
        notes.append(_weights_text(layout.tasks))
    if layout.haystacks:
        notes.append("haystacks " + _weights_text(dict(layout.haystacks)))
    return text + (f" ({'; '.join(notes)})" if notes else "")


def phase_docs() -> str:
    """One paragraph per phase of :data:`PHASES`: steps, learning rate, lengths, mix, and why."""
    out = [f"Task weights where a phase or layout names none: {_weights_text(TASK_WEIGHTS)}."]
    for n, ph in enumerate(PHASES, 1):
        lr = f"own warm-up and cosine from lr {ph.lr[0]:g}" if ph.lr else "continuing the cosine"
        lo, hi = min(max(96, b // 2) for b in ph.buckets), max(ph.buckets) - 8
        shares, prev = [], 0.0
        for below, layout in ph.mix:
            if below > prev:
                shares.append(f"{_percent(below - prev)} {_layout_text(layout)}")
            prev = below
        tasks = f"; tasks {_weights_text(ph.tasks)}" if ph.tasks else ""
        batches = "/".join(map(str, ph.buckets))
        head = f"phase {n} (steps {ph.first}-{ph.end}, {lr}, {lo}-{hi}-token samples in batches of {batches})"
        out.append(f"{head}: {', '.join(shares)}{tasks}. Why: {ph.why}.")
    return "\n\n".join(out)


__doc__ = __doc__.replace("{phases}", phase_docs())

# ---- batches ------------------------------------------------------------------------------------------


def make_batch(samples, modes, gen: torch.Generator, length: int, t_min: float = 0.02, weighting: str = "mean"):
    """Pad to ``length``, mask, and build the segment-local attention mask.

    Each row's t is drawn stratified over the batch (t_i = t_min + (1-t_min)(u + i)/B, a standard
    variance reduction) and masks each eligible token (``modes``: "answer", "query" or "all") with
    probability t. ``weighting="mean"`` (the default, as the CLI's): the plain mean cross-entropy over
    each row's masked tokens (at least one per row). ``"elbo"``: loss weights 1/(t*n) on masked tokens
    (n = eligible tokens of the row), the masked-diffusion ELBO.

    Returns ids (masked) [B, L], targets [B, L], loss weights [B, L] (0 off the masked tokens),
    positions [B, L], attention mask [B, L, L] bool or None.
    """
    L = length
    B = len(samples)
    ids = torch.full((B, L), data.PAD, dtype=torch.long)
    seg = torch.full((B, L), -1, dtype=torch.long)
    eligible = torch.zeros(B, L, dtype=torch.bool)
    for i, (s, mode) in enumerate(zip(samples, modes)):
        n = len(s.ids)
        ids[i, :n] = torch.tensor(s.ids)
        seg[i, :n] = torch.tensor(s.segment)
        roles = s.role
        want = {"answer": "a", "query": "q", "all": "pqa"}[mode]
        eligible[i, :n] = torch.tensor([r in want for r in roles])
    u = (torch.rand(1, generator=gen) + torch.arange(B)[:, None]) / B
    t = t_min + (1 - t_min) * u[torch.randperm(B, generator=gen)]
    masked = (torch.rand(B, L, generator=gen) < t) & eligible
    if weighting == "elbo":
        n_elig = eligible.sum(dim=1, keepdim=True).clamp_min(1)
        weights = masked.float() / (t * n_elig)
    else:
        # at least one masked token per row (the first eligible one), then the mean over them
        none = ~masked.any(dim=1)
        first = eligible.float().argmax(dim=1)
        masked[none, first[none]] = eligible[none, first[none]]
        weights = masked.float() / masked.sum(dim=1, keepdim=True).clamp_min(1)
    inputs = torch.where(masked, torch.full_like(ids, data.MASK), ids)
    valid = seg >= 0
    if (seg > 0).any():
        # static-segment rows see only their segment; live rows (0) and pads see every valid key
        same = seg[:, :, None] == seg[:, None, :]
        live_row = (seg <= 0)[:, :, None]
        attn = valid[:, None, :] & (same | live_row)
    elif not valid.all():
        attn = valid[:, None, :].expand(B, L, L)
    else:
        attn = None
    pos = torch.arange(L).expand(B, L)
    return inputs, ids, weights, pos, attn


# ---- training -----------------------------------------------------------------------------------------


def _init_model(vocab: int, arch: dict = ARCH) -> DiffusionLM:
    model = DiffusionLM(model_config(vocab, arch))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                p.zero_()
    return model


def train(args):
    """Run (or resume, ``--resume``) the curriculum of :data:`PHASES` from ``--seed``; returns the model.
    Writes ``train_state.pt`` and ``loss.csv`` into ``--work`` and the checkpoint into ``--out`` every
    ``--save-every`` steps."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)  # samples
    gen = torch.Generator().manual_seed(args.seed)  # masks
    ckpt = os.path.join(args.work, "train_state.pt")
    state = torch.load(ckpt, weights_only=False) if args.resume and os.path.exists(ckpt) else None
    args.arch = arch_of(args, None if state is None else state.get("arch"))  # before anything is written
    tok = save_char_tokenizer(args.out)
    vocab = len(tok)
    assert tok.mask_token_id == data.MASK and tok.bos_token_id == data.BOS, SPECIALS
    model = _init_model(vocab, args.arch)
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, {args.arch}")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    essays = data.EssayStream()
    log_path = os.path.join(args.work, "loss.csv")
    os.makedirs(args.work, exist_ok=True)
    runs = schedule(args)
    end_step = args.steps
    if args.phase is not None:  # one phase alone, over its table steps, its own warm-up and cosine
        spec = PHASES[args.phase - 1]
        if spec.lr is None:
            raise SystemExit(f"error: --phase {args.phase} has no learning rate of its own")
        peak = getattr(args, _lr_flag(args.phase))
        runs = [PhaseRun(args.phase, spec, spec.first, spec.end, spec.first, spec.end, peak, spec.lr[1])]
        end_step = spec.end
    if args.stop_at is not None:  # stop early (to resume later); the schedule stays the table's
        end_step = min(end_step, args.stop_at)
    first_step = runs[0].first if args.phase is not None else 0
    if args.init and state is None:
        from dllm.model.weights import load_weights_into

        load_weights_into(model, args.init, "dream")
        print(f"weights from {args.init}, step {first_step}")
    if state is not None:
        model.load_state_dict(state["model"])
        model.to(args.device)  # the optimizer state follows the parameters' device
        opt.load_state_dict(state["opt"])
        rng.setstate(state["rng"])
        gen.set_state(state["gen"])
        torch.set_rng_state(state["torch_rng"])
        first_step = state["step"]
        print(f"resumed at step {first_step}")
    elif os.path.exists(log_path):
        os.remove(log_path)
    model.to(args.device).train()
    t0 = time.time()
    for step in range(first_step, end_step):
        run = run_at(runs, step)
        length, samples, modes = draw_batch(rng, essays, run.spec, args.window, args.token_budget)
        batch = make_batch(samples, modes, gen, length, weighting=args.weighting)
        inputs, targets, weights, pos, attn = (None if x is None else x.to(args.device) for x in batch)
        for g in opt.param_groups:
            g["lr"] = run.lr(step)
        with torch.autocast(torch.device(args.device).type, dtype=torch.bfloat16, enabled=args.bf16):
            logits = model(inputs, pos, attention_mask=attn).logits
        ce = F.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1), reduction="none").view_as(weights)
        loss = (ce * weights).sum() / len(samples)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        masked_ce = ce[weights > 0].mean().item() if (weights > 0).any() else 0.0
        row = [step, run.n, length, len(samples), f"{loss.item():.4f}", f"{gnorm.item():.3f}", f"{masked_ce:.4f}"]
        with open(log_path, "a", newline="") as f:
            csv.writer(f).writerow(row + [f"{time.time() - t0:.1f}"])
        if step % 25 == 0:
            print(
                f"step {step:5d} ph{run.n} L={length:4d} B={len(samples):2d} loss {loss.item():.3f} "
                f"masked-CE {masked_ce:.3f} |g| {gnorm.item():.2f} {time.time() - t0:.0f}s",
                flush=True,
            )
        if (step + 1) % args.save_every == 0 or step + 1 == end_step:
            state = {"model": model.state_dict(), "opt": opt.state_dict(), "rng": rng.getstate(), "arch": args.arch}
            state |= {"gen": gen.get_state(), "torch_rng": torch.get_rng_state(), "step": step + 1}
            torch.save(state, ckpt)
            export(model, args, vocab)
    return model


def export(model, args, vocab):
    """Write config.json + model.safetensors (fp32) into args.out (tokenizer files are already there)."""
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(dream_config_json(vocab, args.window, args.arch), f, indent=2)
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump(
            {
                "alg": "maskgit_plus",
                "temperature": 0.0,
                "eps": 0.001,
                "steps": 16,
                "mask_token_id": data.MASK,
                "bos_token_id": data.BOS,
                "eos_token_id": data.EOS,
                "pad_token_id": data.PAD,
            },
            f,
            indent=2,
        )
    save_checkpoint(model, args.out, "dream")


def parse_args(argv=None) -> argparse.Namespace:
    """The flags of ``python -m bench.tiny.train``; the phase ends and peak lrs default to :data:`PHASES`."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="dllm/assets/tiny-dream", help="HF-format output directory")
    p.add_argument("--work", default="bench/results/tiny-train", help="training state + loss log")
    p.add_argument(
        "--steps", type=int, default=BUNDLED_STEPS, help=f"total steps (default {BUNDLED_STEPS}: the bundled model)"
    )
    for n, ph in enumerate(PHASES[:-1], 1):  # the last phase ends at --steps
        p.add_argument(f"--phase{n}", type=int, default=ph.end, help=f"end of phase {n} (default {ph.end})")
    for n, ph in enumerate(PHASES, 1):
        if ph.lr:
            upto = next((m for m in range(n + 1, len(PHASES) + 1) if PHASES[m - 1].lr), len(PHASES) + 1) - 1
            which = f"phase {n}" if upto == n else f"phases {n}-{upto}"
            p.add_argument(f"--{_lr_flag(n)}", type=float, default=ph.lr[0], help=f"peak learning rate of {which}")
    p.add_argument(
        "--weighting",
        default="mean",
        choices=["mean", "elbo"],
        help="masked-token loss: per-row mean (default) or 1/(t*n) ELBO weights",
    )
    p.add_argument("--window", type=int, default=1536, help="longest training sequence (tokens)")
    p.add_argument("--token-budget", type=int, default=8192, help="tokens per batch (batch = budget // length)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--save-every", type=int, default=100)
    p.add_argument(
        "--no-bf16",
        dest="bf16",
        action="store_false",
        help="fp32 instead of bf16 autocast (on a CPU without AVX-512 BF16 bf16 is emulated: 120 s a step here)",
    )
    p.add_argument("--device", default="cpu", help="torch device to train on (cpu, cuda)")
    p.add_argument("--stop-at", type=int, default=None, help="stop before this step (the lr schedule unchanged)")
    p.add_argument("--resume", action="store_true", help="continue from --work's train_state.pt when there is one")
    p.add_argument(
        "--phase", type=int, choices=range(1, len(PHASES) + 1), default=None,
        help="train only this phase, over its table steps (its own warm-up and cosine); with --init",
    )  # fmt: skip
    p.add_argument("--init", default=None, help="start from this checkpoint's weights (a fresh optimizer)")
    size = p.add_argument_group("model size (from scratch; default the bundled model's, or --init's)")
    for key, flag in ARCH_FLAGS.items():
        size.add_argument(flag, dest=key, type=int, default=None, help=f"{key} (bundled: {ARCH[key]}; at least 1)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    """Train; a model size that cannot be trained is one ``error:`` line and exit code 2."""
    try:
        train(parse_args(argv))
    except SizeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
