"""Which retrieval skills the tiny model has: one parallel pass with every answer token masked.

    python -m bench.tiny.skill_probe [--model dllm/assets/tiny-dream] [--cases 16]

For each probe, ``--cases`` seeded cases (seeds from 900000, never drawn by training) are decoded in a
single denoising step: the prompt is clean, every answer token is the mask token, and we read the answer
tokens' cross-entropy (nats per token) and the share of answer tokens that are the argmax. This is like
the first step of dense decoding (which masks 4 more slots for the EOS), so it shows whether the model
can read the answer off the context at all, not what the full decode loop makes of it (``python -m dllm
eval`` does that).

The probes separate what the model must do to answer:

- digits after a fixed phrase: passkey / number_string (the canonical needle reads "pass key is" /
  "sequence of digits is"), so a head can learn where the digits sit relative to that phrase;
- a 36-character value after a fixed anchor: kv_retrieval with a single pair (copy the only value,
  the one after ``": "``);
- lookup by content: kv_retrieval with several pairs (find the asked UUID key, copy the value after
  it) and needle (find the sentence about the asked subject), which need a head that matches the
  query's content to the context's (an induction head);
- copy at a fixed offset: the training format of ``data.copy_sample`` (a random string, two
  newlines, the same string again), every answer token the twin of a context token; 36 characters
  (a UUID's length) and 200 (inside the 46-762 characters that phases 5-7 trained on).

Writes ``bench/results/tiny_skill_probe.md``. Chance is ln(alphabet size): ln 10 = 2.30 for digits,
ln 17 = 2.83 for random strings over the UUID alphabet (hex digits and dash). For the kv_retrieval
probes chance is a guess that knows the UUID v4 layout (dashes, the version '4', the variant nibble)
but not the value: 2.35 nats and 20% of the characters.
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bench.provenance import machine_line
from bench.tiny import data
from dllm.eval.tasks import make_case
from dllm.model.loader import load_model

# a guess that knows the UUID v4 layout but not the value: 4 dashes and the version '4' certain, the
# variant nibble one of 4, the other 30 characters one of 16 (2.35 nats, 20% of characters right)
UUID_CHANCE = (30 * math.log(16) + math.log(4)) / 36
PROBE_SEED = 900_000  # training draws task seeds below 2**30 from its own rng; these cases are fixed
OUT_MD = "bench/results/tiny_skill_probe.md"


@dataclass(frozen=True)
class Probe:
    name: str
    needs: str  # what answering takes (see the module docstring)
    chance: float | None  # cross-entropy (nats) of an uninformed guess (module docstring); None: not defined
    make: Callable[[int], tuple[list[int], list[int]]]  # seed -> (prompt ids, answer ids)


def _task(task: str, length: int):
    def make(seed: int):
        case = make_case(task, length, (seed % 11) / 10, seed)
        return [data.BOS] + data.encode(case.prompt), data.encode(case.answer)

    return make


def _copy(pool: str, n: int):
    def make(seed: int):
        s = data.copy_sample(random.Random(seed), 2 * n + 4, pool)
        first = s.role.index("a")
        return s.ids[:first], s.ids[first:-1]  # the answer without its EOS

    return make


PROBES = (
    Probe("passkey, 512 tokens", "digits after a fixed phrase", math.log(10), _task("passkey", 512)),
    Probe("number_string, 512 tokens", "digits after a fixed phrase", math.log(10), _task("number_string", 512)),
    Probe("kv_retrieval, 1 pair (100 tokens)", "value after a fixed anchor", UUID_CHANCE, _task("kv_retrieval", 100)),
    Probe("kv_retrieval, 6 pairs (512 tokens)", "lookup by content", UUID_CHANCE, _task("kv_retrieval", 512)),
    Probe("needle, 512 tokens", "lookup by content", None, _task("needle", 512)),
    Probe("copy 36 digits", "copy at a fixed offset", math.log(10), _copy(data.DIGIT_POOL, 36)),
    Probe("copy 36 UUID characters", "copy at a fixed offset", math.log(17), _copy(data.HEX_POOL, 36)),
    Probe("copy 200 digits (trained length)", "copy at a fixed offset", math.log(10), _copy(data.DIGIT_POOL, 200)),
    Probe(
        "copy 200 UUID characters (trained length)", "copy at a fixed offset", math.log(17), _copy(data.HEX_POOL, 200)
    ),
)


@torch.no_grad()
def answer_probe(model, rows: list[tuple[list[int], list[int]]]) -> tuple[float, float]:
    """Mask every answer token of each row, run one batched forward pass, score the answer tokens.

    Args:
        model: a loaded :class:`dllm.model.modeling.DiffusionLM` (shifted logits handled by the model).
        rows: (prompt ids, answer ids) pairs; the prompt starts with BOS.

    Returns:
        (mean cross-entropy in nats over all answer tokens, share of answer tokens whose argmax is right).

    Raises:
        ValueError: no rows, or a row with an empty answer.
    """
    if not rows or any(not ans for _, ans in rows):
        raise ValueError("answer_probe needs at least one row and a non-empty answer in every row")
    n = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((len(rows), n), data.PAD)  # [N, n] prompt + masked answer, right-padded
    gold = torch.full((len(rows), n), data.PAD)
    is_answer = torch.zeros(len(rows), n, dtype=torch.bool)
    valid = torch.zeros(len(rows), n, dtype=torch.bool)  # key-padding mask
    for i, (prompt, ans) in enumerate(rows):
        p, a = len(prompt), len(ans)
        ids[i, :p] = torch.tensor(prompt)
        ids[i, p : p + a] = data.MASK
        gold[i, p : p + a] = torch.tensor(ans)
        is_answer[i, p : p + a] = True
        valid[i, : p + a] = True
    logits = model(ids, torch.arange(n), attention_mask=valid).logits.float()  # [N, n, V]
    ce = F.cross_entropy(logits[is_answer], gold[is_answer]).item()
    acc = (logits.argmax(-1) == gold)[is_answer].float().mean().item()
    return ce, acc


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="dllm/assets/tiny-dream")
    p.add_argument("--cases", type=int, default=16, help="seeded cases per probe")
    p.add_argument("--out", default=OUT_MD)
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    model = load_model(args.model, device="cpu", dtype=torch.float32)
    lines = [
        "# Tiny model skill probe",
        "",
        f"`python -m bench.tiny.skill_probe --model {args.model} --cases {args.cases}`; {machine_line()}.",
        "One parallel pass, every answer token masked (like the first denoising step of dense decoding);",
        "cross-entropy in nats per answer token. Chance: ln of the answer alphabet's size; for kv_retrieval",
        f"a guess that knows the UUID v4 layout but not the value ({UUID_CHANCE:.2f} nats, 20% of characters right).",
        "",
        "| probe | what it takes | cross-entropy | chance | answer tokens right |",
        "|---|---|---|---|---|",
    ]
    for probe in PROBES:
        rows = [probe.make(PROBE_SEED + i) for i in range(args.cases)]
        ce, acc = answer_probe(model, rows)
        chance = "-" if probe.chance is None else f"{probe.chance:.2f}"
        lines.append(f"| {probe.name} | {probe.needs} | {ce:.3f} | {chance} | {acc:.0%} |")
        print(lines[-1], flush=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
