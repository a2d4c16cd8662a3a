"""Train the bundled tiny Dream-layout dLLM with the masked-diffusion objective.

    python -m bench.tiny.train --out dllm/assets/tiny-dream

Model: Dream/Qwen2 layout (shifted logits, GQA 8/2 heads, RoPE, q/k/v bias,
SwiGLU, untied head), 4 layers x 256 wide, ~2.9M parameters, character-level
vocabulary. Objective (LLaDA / Dream masked diffusion): draw t ~ U(t_min, 1),
mask each eligible token with probability t, predict the masked tokens. Per-sequence
loss = mean cross-entropy over the sequence's masked tokens, then mean over the batch:
each sequence weighs the same however few answer tokens it has (DESIGN section 6), and
since the realised mask count k has mean t * n this is the ELBO's 1/(t n) weight with
k in place of t n (self-normalised). The literal 1/(t n) weights (``--weighting elbo``)
learned the copy task far slower in a controlled probe (short passkey cases, bf16,
lr 1.5e-3: digit cross-entropy 2.07 nats after 150 steps with stratified t, ~2.3 with
i.i.d. t, against 1.72 with the per-row mean; chance is ln 10 = 2.30).

Curriculum (DESIGN section 6 warns that a robust mix from step 0 does not learn; a first run
of this script with the mix from step 0 still retrieved nothing after 750 steps):
phase 1 = passkey and number_string only, short (96-184 tokens, no instruction prefix, mostly
canonical wording), answer-only masking: the copy circuit forms faster when the needle is near
the query and the wording is fixed (the same recipe at 192-384 tokens was still at chance after
300 steps; and 700 steps of it were not enough: the half-formed skill was lost when phase 2 began);
phase 2 = all four tasks, up to 768 tokens, some chunked layout, some whole-sequence masking;
phase 3 = lengths up to the window, the chunked layout of Prefilling-dLLM, needle-free chunks and
packed essays; phase 4 = a retrieval fine-tune with its own warm-up and cosine (passkey and
number_string only, 96-504 tokens, dense and chunked layouts, answer-only masking, 10% needle-free
chunks with query-only masking). Why phase 4: in the run that made the bundled model, the copy skill
of phase 1 (digit cross-entropy with every answer digit masked: 0.89 nats on 150-token passkey
cases at step 600, flat to step 900; chance is 2.30) was gone by step 1400 (1.54) and the model
retrieved 0 of 40 short cases at step 1900.
phase 5 = a second fine-tune (own warm-up and cosine, lr 7e-4, buckets of 192-1024 tokens) for what
phase 4 left: 10% copy strings (``data.copy_sample``: every answer token is a lookup, a dense signal
for the copy circuit), 40% dense and 25% chunked retrieval answers (passkey, number_string, some
needle), and 25% query-only masking split evenly between chunk sets with and without the needle.
Phases 3-4 masked the query beside needle-free chunks only, which taught the model that a query is
likely whatever the context: on the phase-4 model s_I + s_P ranked the needle chunk last in 10 of 10
passkey cases at 8K (s_I alone found it in 5 of 10 on the phase-5 model).
phase 6 = a third fine-tune (steps 6000-9500, own warm-up and cosine, lr 5e-4, buckets of 256-1280 tokens)
for the ordering errors phase 5 left: its passkey/number_string misses at 1024 tokens hold the key's
digits in the wrong order (2883242612 -> 2883423262). 15% copy strings, half of them digits only (only
the order tells the digits apart), 45% dense and 20% chunked answers (passkey .4, number_string .45,
needle .15), 20% query-only masking (half beside the needle chunk), and 1280-token batches so the
1024-token cases are no longer at the edge of what the model has seen.
phase 7 = a fourth fine-tune (steps 9500-12000, own warm-up and cosine, lr 5e-4, buckets of 256-1536 tokens)
for the tasks phase 6 left at 0% (kv_retrieval's 36-character UUID values, needle's word answers) and
number_string at 1024 tokens: 15% copy strings (half from kv_retrieval's hex-and-dash alphabet, a quarter
digits only, a quarter letters, digits and spaces), 45% dense and 20% chunked answers (passkey .15,
number_string .3, kv_retrieval .3, needle .25), 20% query-only masking.
phase 8 (only with ``--steps`` beyond ``--phase7``; NOT in the bundled model) = a trial fifth fine-tune
(steps 12000-14000, own warm-up and cosine, lr 3e-4, buckets of 512-1536 tokens) for the digit tasks'
one-digit copy errors: no copy strings (``bench.tiny.skill_probe`` finds copies of the phase 5-7 copy
strings' lengths at chance: the model never learned them), 55% dense and 30% chunked answers (passkey .3,
number_string .5, kv_retrieval .1, needle .1), 15% query-only masking. It took dense number_string to
100% but made chunk selection worse (``bench/results/tiny_phase8_trial.md``), so the default ``--steps``
stops at 12000.
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
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bench.tiny import data
from bench.tiny.tokenizer import SPECIALS, save_char_tokenizer
from dllm.config import ModelConfig
from dllm.modeling import DiffusionLM
from dllm.weights import save_checkpoint

ARCH = dict(
    hidden_size=256,
    intermediate_size=704,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
)


def dream_config_json(vocab_size: int, window: int) -> dict:
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
        "max_window_layers": ARCH["num_hidden_layers"],
        "rope_scaling": None,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "use_mrope": False,
        "use_sliding_window": False,
        "vocab_size": vocab_size,
        **ARCH,
    }


def model_config(vocab_size: int) -> ModelConfig:
    return ModelConfig(
        family="dream",
        vocab_size=vocab_size,
        hidden_size=ARCH["hidden_size"],
        intermediate_size=ARCH["intermediate_size"],
        num_layers=ARCH["num_hidden_layers"],
        num_heads=ARCH["num_attention_heads"],
        num_kv_heads=ARCH["num_key_value_heads"],
        head_dim=ARCH["hidden_size"] // ARCH["num_attention_heads"],
        rope_theta=ARCH["rope_theta"],
        rms_norm_eps=ARCH["rms_norm_eps"],
        qkv_bias=True,
        tie_word_embeddings=False,
        shift_logits=True,
        mask_token_id=data.MASK,
        bos_token_id=data.BOS,
        eos_token_id=data.EOS,
        pad_token_id=data.PAD,
    )


# ---- batches ------------------------------------------------------------------------------------------

TASK_WEIGHTS = {"passkey": 0.3, "number_string": 0.25, "kv_retrieval": 0.15, "needle": 0.3}


@dataclass(frozen=True)
class FineTuneMix:
    """Sample mix of the late fine-tunes: cumulative thresholds on one uniform draw u.

    u < copy: copy string over an alphabet drawn from the weighted ``copy_pools`` (letters, digits
    and spaces when empty); u < dense: dense answer;
    u < chunked: chunked answer; else query-only masking, beside needle-free chunks when u >= no_needle.
    """

    copy: float
    dense: float
    chunked: float
    no_needle: float
    answer_tasks: dict  # task -> weight of the answer samples
    copy_pools: tuple = ()  # ((alphabet, weight), ...)


FINE_TUNE_MIX = {
    5: FineTuneMix(0.1, 0.5, 0.75, 0.875, {"passkey": 0.45, "number_string": 0.4, "needle": 0.15}),
    6: FineTuneMix(
        0.15,
        0.6,
        0.8,
        0.9,
        {"passkey": 0.4, "number_string": 0.45, "needle": 0.15},
        copy_pools=((data.DIGIT_POOL, 0.5), (data.COPY_POOL, 0.5)),
    ),
    7: FineTuneMix(
        0.15,
        0.6,
        0.8,
        0.9,
        {"passkey": 0.15, "number_string": 0.3, "kv_retrieval": 0.3, "needle": 0.25},
        copy_pools=((data.HEX_POOL, 0.5), (data.DIGIT_POOL, 0.25), (data.COPY_POOL, 0.25)),
    ),
    8: FineTuneMix(0.0, 0.55, 0.85, 0.925, {"passkey": 0.3, "number_string": 0.5, "kv_retrieval": 0.1, "needle": 0.1}),
}


def fine_tune_sample(rng: random.Random, total: int, mix: FineTuneMix) -> tuple[data.Sample, str]:
    """One sample of phase 5 or 6 (the draws happen in a fixed order: a resumed run repeats its data)."""
    u = rng.random()
    if u < mix.copy:
        pool = data.COPY_POOL
        if mix.copy_pools:  # one rng.random() draw, as the phase-6 run made it
            pools, weights = zip(*mix.copy_pools)
            pool = rng.choices(pools, weights=weights)[0]
        return data.copy_sample(rng, total, pool), "answer"
    if u < mix.chunked:
        task = rng.choices(list(mix.answer_tasks), weights=list(mix.answer_tasks.values()))[0]
        if u < mix.dense:
            phrasing = "canonical" if rng.random() < 0.5 else "random"
            return data.dense_sample(rng, total, task, phrasing, prefix=rng.random() < 0.6, max_eos=6), "answer"
        return data.chunked_sample(rng, total, task), "answer"
    # s_I's training signal: the query masked beside the needle chunk (it can be read off the
    # needle) as often as beside needle-free chunks (it cannot)
    task = rng.choices(list(TASK_WEIGHTS), weights=list(TASK_WEIGHTS.values()))[0]
    return data.chunked_sample(rng, total, task, drop_needle=u >= mix.no_needle, answer=False), "query"


def draw_sample(rng: random.Random, essays: data.EssayStream, total: int, phase: int) -> tuple[data.Sample, str]:
    """One sample and its masking mode for the curriculum phase."""
    if phase == 1:
        task = "passkey" if rng.random() < 0.6 else "number_string"
        phrasing = "canonical" if rng.random() < 0.7 else "random"
        return data.dense_sample(rng, total, task, phrasing, prefix=False, max_eos=3), "answer"
    if phase in FINE_TUNE_MIX:
        return fine_tune_sample(rng, total, FINE_TUNE_MIX[phase])
    if phase == 4:
        task = "passkey" if rng.random() < 0.5 else "number_string"
        u = rng.random()
        if u < 0.45:
            phrasing = "canonical" if rng.random() < 0.6 else "random"
            return data.dense_sample(rng, total, task, phrasing, prefix=rng.random() < 0.5, max_eos=3), "answer"
        if u < 0.9:
            return data.chunked_sample(rng, total, task), "answer"
        return data.chunked_sample(rng, total, task, drop_needle=True), "query"
    task = rng.choices(list(TASK_WEIGHTS), weights=list(TASK_WEIGHTS.values()))[0]
    u = rng.random()
    if phase == 2:
        if u < 0.8:
            return data.dense_sample(rng, total, task), "answer" if rng.random() < 0.85 else "all"
        if u < 0.95:
            return data.chunked_sample(rng, total, task), "answer"
        return essays.sample(rng, total), "all"
    if u < 0.4:
        return data.dense_sample(rng, total, task), "answer" if rng.random() < 0.8 else "all"
    if u < 0.75:
        return data.chunked_sample(rng, total, task), "answer" if rng.random() < 0.85 else "all"
    if u < 0.85:
        return data.chunked_sample(rng, total, task, drop_needle=True), "query"
    return essays.sample(rng, total), "all"


def make_batch(samples, modes, gen: torch.Generator, length: int, t_min: float = 0.02, weighting: str = "elbo"):
    """Pad to ``length``, mask, and build the segment-local attention mask.

    ``weighting="elbo"``: loss weights 1/(t*n) on masked tokens (n = eligible tokens of the row), the
    masked-diffusion ELBO with t drawn stratified over the batch (t_i = t_min + (1-t_min)(u + i)/B, a
    standard variance reduction). ``"mean"``: the plain mean cross-entropy over each row's masked tokens.

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


# Batch shapes come from a few buckets: CPU matmul kernels (oneDNN) are built per shape, and a new
# shape every step cost 2-4 s of a ~1.5 s step in a probe.
BUCKETS = {
    1: (192,),
    2: (256, 384, 512, 640, 768),
    3: (256, 384, 512, 768, 1024, 1280, 1536),
    4: (192, 256, 384, 512),
    5: (192, 256, 384, 512, 768, 1024),
    6: (256, 512, 768, 1024, 1280),
    7: (256, 512, 768, 1024, 1280, 1536),
    8: (512, 768, 1024, 1280, 1536),
}


def lr_at(step: int, total: int, peak: float, warmup: int = 100) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    p = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


# ---- training -----------------------------------------------------------------------------------------


def train(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    tok_dir = args.out
    tok = save_char_tokenizer(tok_dir)
    vocab = len(tok)
    assert tok.mask_token_id == data.MASK and tok.bos_token_id == data.BOS, SPECIALS
    model = DiffusionLM(model_config(vocab))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                p.zero_()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    essays = data.EssayStream()
    ckpt = os.path.join(args.work, "train_state.pt")
    log_path = os.path.join(args.work, "loss.csv")
    os.makedirs(args.work, exist_ok=True)
    start = 0
    if args.resume and os.path.exists(ckpt):
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        rng.setstate(state["rng"])
        gen.set_state(state["gen"])
        torch.set_rng_state(state["torch_rng"])
        start = state["step"]
        print(f"resumed at step {start}")
    elif os.path.exists(log_path):
        os.remove(log_path)
    model.train()
    # phase 7 ends at --steps when that comes first (then there is no phase 8)
    phase7_end = min(args.phase7, args.steps)
    ends = (args.phase1, args.phase2, args.phase3, args.phase4, args.phase5, args.phase6, phase7_end, args.steps)
    peaks = {4: args.lr4, 5: args.lr5, 6: args.lr6, 7: args.lr7, 8: args.lr8}
    restarts = {ph: (ends[ph - 2], ends[ph - 1], lr) for ph, lr in peaks.items()}  # phase -> (first, end, peak)
    t0 = time.time()
    for step in range(start, args.steps):
        phase = 1 + sum(step >= end for end in ends[:-1])
        length = rng.choice([b for b in BUCKETS[phase] if b <= args.window])
        bsz = max(2, args.token_budget // length)
        pairs = []
        while len(pairs) < bsz:  # redraw the rare sample that overshoots its bucket (never truncate answers)
            total = rng.randint(max(96, length // 2), length - 8)
            s, mode = draw_sample(rng, essays, total, phase)
            if len(s.ids) <= length:
                pairs.append((s, mode))
        samples = [s for s, _ in pairs]
        modes = [m for _, m in pairs]
        inputs, targets, weights, pos, attn = make_batch(samples, modes, gen, length, weighting=args.weighting)
        for g in opt.param_groups:
            if phase < 4:
                g["lr"] = lr_at(step, args.phase3, args.lr)
            else:  # phases 4-8 restart their own warm-up + cosine
                start, end, peak = restarts[phase]
                g["lr"] = lr_at(step - start, end - start, peak, warmup=50)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            logits = model(inputs, pos, attention_mask=attn).logits
        ce = F.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1), reduction="none").view_as(weights)
        loss = (ce * weights).sum() / len(samples)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ans = weights > 0
        with open(log_path, "a", newline="") as f:
            csv.writer(f).writerow(
                [
                    step,
                    phase,
                    length,
                    bsz,
                    f"{loss.item():.4f}",
                    f"{gnorm.item():.3f}",
                    f"{(ce[ans].mean().item() if ans.any() else 0):.4f}",
                    f"{time.time() - t0:.1f}",
                ]
            )
        if step % 25 == 0:
            print(
                f"step {step:5d} ph{phase} L={length:4d} B={bsz:2d} loss {loss.item():.3f} "
                f"masked-CE {ce[ans].mean().item():.3f} |g| {gnorm.item():.2f} {time.time() - t0:.0f}s",
                flush=True,
            )
        if (step + 1) % args.save_every == 0 or step + 1 == args.steps:
            torch.save(
                {
                    "model": model.state_dict(),
                    "opt": opt.state_dict(),
                    "rng": rng.getstate(),
                    "gen": gen.get_state(),
                    "torch_rng": torch.get_rng_state(),
                    "step": step + 1,
                },
                ckpt,
            )
            export(model, args, vocab)
    return model


def export(model, args, vocab):
    """Write config.json + model.safetensors (fp32) into args.out (tokenizer files are already there)."""
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(dream_config_json(vocab, args.window), f, indent=2)
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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="dllm/assets/tiny-dream", help="HF-format output directory")
    p.add_argument("--work", default="bench/results/tiny-train", help="training state + loss log")
    p.add_argument(
        "--steps", type=int, default=12000, help="total steps (default: the end of phase 7, the bundled model)"
    )
    p.add_argument("--phase1", type=int, default=900, help="end of phase 1 (copying: passkey, number_string)")
    p.add_argument("--phase2", type=int, default=1350, help="end of phase 2 (all tasks, up to 768 tokens)")
    p.add_argument("--phase3", type=int, default=1900, help="end of phase 3 (everything up to the window)")
    p.add_argument("--phase4", type=int, default=3300, help="end of phase 4 (retrieval fine-tune)")
    p.add_argument("--phase5", type=int, default=6000, help="end of phase 5 (copy + retrieval + query masking)")
    p.add_argument("--phase6", type=int, default=9500, help="end of phase 6 (digit order, up to 1280 tokens)")
    p.add_argument("--phase7", type=int, default=12000, help="end of phase 7 (beyond it: the phase-8 trial)")
    p.add_argument(
        "--weighting",
        default="mean",
        choices=["mean", "elbo"],
        help="masked-token loss: per-row mean (default) or 1/(t*n) ELBO weights",
    )
    p.add_argument("--window", type=int, default=1536, help="longest training sequence (tokens)")
    p.add_argument("--token-budget", type=int, default=8192, help="tokens per batch (batch = budget // length)")
    p.add_argument("--lr", type=float, default=1.5e-3, help="peak learning rate of phases 1-3")
    p.add_argument("--lr4", type=float, default=1e-3, help="peak learning rate of phase 4")
    p.add_argument("--lr5", type=float, default=7e-4, help="peak learning rate of phase 5")
    p.add_argument("--lr6", type=float, default=5e-4, help="peak learning rate of phase 6")
    p.add_argument("--lr7", type=float, default=5e-4, help="peak learning rate of phase 7")
    p.add_argument("--lr8", type=float, default=3e-4, help="peak learning rate of phase 8 (trial)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--save-every", type=int, default=100)
    p.add_argument("--no-bf16", dest="bf16", action="store_false", help="fp32 instead of bf16 autocast")
    p.add_argument("--resume", action="store_true")
    args = p.parse_args(argv)
    train(args)


if __name__ == "__main__":
    main()
