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
import os
import random
import shutil
import sys
import time

import torch
import torch.nn.functional as F

from bench.tiny import data
from bench.tiny.curriculum import BUNDLED_STEPS, PHASES, PhaseRun, draw_batch, lr_flag, phase_docs, run_at, schedule
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
        peak = getattr(args, lr_flag(args.phase))
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
    """Write config.json + model.safetensors (fp32) into args.out (tokenizer files are already there); a
    fine-tune (``--init``) keeps the initial checkpoint's ``prefilling_config.json``: without it the library's
    defaults (C=1024, fixed K) would read the fine-tuned weights in a layout the tiny model never saw."""
    init_cfg = os.path.join(args.init, "prefilling_config.json") if args.init else ""
    if init_cfg and os.path.isfile(init_cfg) and os.path.abspath(args.init) != os.path.abspath(args.out):
        shutil.copyfile(init_cfg, os.path.join(args.out, "prefilling_config.json"))
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
            p.add_argument(f"--{lr_flag(n)}", type=float, default=ph.lr[0], help=f"peak learning rate of {which}")
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
