"""Train the tiny dLLM from scratch in one short GPU run: batches drawn ahead in worker processes, a step
bound by the GPU, resumable across calls, every output in at most 8 files of at most 16 MiB.

    python -m bench.tiny.gpu_run --out OUT --corpus bench/tiny/corpus_build --device cuda \\
        --steps 6000 --budget-s 510 [--resume STATE_DIR]
    python -m bench.tiny.gpu_run export --state OUT --model MODEL_DIR     # HF checkpoint from the state

The step: ``--workers`` processes draw and mask whole batches ahead (``--prefetch`` per
worker) as compact numpy arrays (uint8 ids, int8 segments, float32 loss weights); the main process only
copies them to the device (pinned, non-blocking), builds the segment-local attention mask there, runs
forward/backward under bf16 autocast (CUDA) and a fused AdamW step. No scalar is read per step: loss,
gradient norm and masked-token cross-entropy go into a device accumulator read once every ``--log-every``
steps. The batch of step s is a pure function of (``--seed``, s), so the data position is the step.

The data: :data:`STAGES` over the packed corpus (``bench.tiny.corpus``: manual pages, code
comments, package docs, licences, quotations, number-dense reports, tables) and the evaluation tasks'
own generators on their filler haystacks; never essays, pydoc or another held-out source
(``bench.tiny.sources.HELD_OUT_SOURCES``).

Outputs in ``--out``: ``state-0000k-of-0000n.safetensors`` (fp32 weights ``model/*`` and
AdamW moments ``exp_avg/*``, ``exp_avg_sq/*`` in bf16, shards of at most :data:`SHARD_BYTES`),
``run.json`` (step, sizes, flags, AdamW step count, seconds and machine per call) and ``loss.csv``; at most 6
shards, so a size past ~12M parameters is refused before training. The default size is :data:`GPU_SIZE`. The
resumed moments are the bf16-rounded ones (relative error <= 2^-8), so a resumed run is close to, not
bit-equal with, an uninterrupted one.
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

import numpy as np
import torch
import torch.nn.functional as F

from bench.tiny import data
from bench.tiny.curriculum import lr_at
from bench.tiny.train import ARCH, ARCH_FLAGS, SizeError, _init_model, arch_of

# The default size: 6.7M parameters (2.3x the bundled model), the largest 6-layer width whose resumable state
# (8 bytes a parameter: 51 MiB) and the packed corpus (~6 MiB) fit the 64 MiB the device tool carries, so a
# fresh GPU machine can resume it; 384 x 6 (9.5M, the probe's size) fits the 8 output files but resumes
# only on a machine still warm (its state stays in the working tree there).
GPU_SIZE = {
    "hidden_size": 320,
    "num_hidden_layers": 6,
    "num_attention_heads": 10,
    "num_key_value_heads": 2,
    "intermediate_size": 896,
}
CARRY_BYTES = 64 << 20
SHARD_BYTES = 15 << 20  # 15 MiB of tensors per shard: the header keeps the file under 16 MiB
MAX_SHARDS = 6  # + run.json + loss.csv = 8 files
STATE_BYTES_PER_PARAM = 4 + 2 + 2  # fp32 weight, bf16 exp_avg, bf16 exp_avg_sq
LOG_FIELDS = ["step", "stage", "tokens", "loss", "grad_norm", "masked_ce", "elapsed_s", "tokens_per_s"]


@dataclass(frozen=True)
class Stage:
    """A stage of the run: from ``start`` (fraction of ``--steps``), batch lengths ``buckets`` (tokens) and
    ``mix``: (weight, sample kind) over :func:`draw_sample`'s kinds."""

    start: float
    buckets: tuple[int, ...]
    mix: tuple[tuple[float, str], ...]
    why: str


STAGES = (
    Stage(
        0.0,
        (192, 256),
        ((0.45, "task_dense"), (0.35, "corpus_dense"), (0.2, "copy")),
        "short contexts first: the copy (induction) circuit forms fastest with the needle near the query "
        "(phase 1 of bench.tiny.train)",
    ),
    Stage(
        0.08,
        (256, 384, 512, 768, 1024, 1536),
        (
            (0.15, "lm"),
            (0.08, "copy"),
            (0.12, "task_dense"),
            (0.1, "task_chunked"),
            (0.22, "corpus_dense"),
            (0.17, "corpus_chunked"),
            (0.08, "query_needle"),
            (0.08, "query_no_needle"),
        ),
        "every layout at every length: packed corpus text, copy strings, the tasks' own cases, corpus "
        "facts dense and chunked, and query-only masking beside chunk sets with and without the needle "
        "(the s_I selection signal)",
    ),
)
TASKS = {"passkey": 0.3, "number_string": 0.3, "kv_retrieval": 0.1, "word_fact": 0.3}


def stage_at(step: int, steps: int) -> tuple[int, Stage]:
    """The stage (1-based number, spec) of ``step`` in a run of ``steps``."""
    n = max(i for i, s in enumerate(STAGES) if step >= s.start * steps)
    return n + 1, STAGES[n]


# ---- batches (run in the worker processes) ------------------------------------------------------------

_WORKER: dict = {}


def init_worker(corpus_dir: str) -> None:
    """Load the packed corpus once per worker process (the batches read it)."""
    from bench.tiny.corpus import Corpus
    from bench.tiny.corpus_tasks import CorpusSamples

    torch.set_num_threads(1)
    _WORKER["corpus"] = CorpusSamples(Corpus(corpus_dir))


def draw_sample(rng: random.Random, kind: str, total: int) -> tuple[data.Sample, str]:
    """One sample of about ``total`` tokens of ``kind`` and its masking mode ("answer", "query", "all")."""
    cs = _WORKER["corpus"]
    if kind == "lm":
        return cs.lm(rng, total), "all"
    if kind == "copy":
        pool = rng.choice([data.DIGIT_POOL, data.COPY_POOL, data.HEX_POOL])
        return data.copy_sample(rng, total, pool), "answer"
    if kind == "corpus_dense":
        return cs.dense(rng, total), "answer"
    if kind == "corpus_chunked":
        return cs.chunked(rng, total), "answer"
    if kind in ("query_needle", "query_no_needle"):
        return cs.chunked(rng, total, needle=kind == "query_needle", answer=False), "query"
    task = rng.choices(list(TASKS), weights=list(TASKS.values()))[0]
    hay = "filler"  # the tasks' own noise; "generated" draws its words from the held-out essays and pydoc
    if kind == "task_dense":
        phrasing = "canonical" if rng.random() < 0.4 else "random"
        sample = data.dense_sample(rng, total, task, phrasing, prefix=rng.random() < 0.6, max_eos=6, haystack=hay)
        return sample, "answer"
    if kind == "task_chunked":
        return data.chunked_sample(rng, total, task, haystack=hay), "answer"
    raise ValueError(f"unknown sample kind {kind!r}")


def mask_batch(samples, modes, length: int, nrng: np.random.Generator, t_min: float = 0.02) -> dict:
    """Pad to ``length`` and mask, in numpy (the objective of ``bench.tiny.train.make_batch``, mean weighting):
    row i's t is stratified over the batch, each eligible token is masked with probability t, at least one
    per row, loss weight 1 / (masked tokens of the row) on the masked ones.

    Returns uint8 ``inputs`` and ``targets`` [B, L], float32 ``weights`` [B, L], int8 ``segments`` [B, L]
    (-1 padding, 0 live, k > 0 static chunk k)."""
    b = len(samples)
    ids = np.zeros((b, length), np.uint8)
    seg = np.full((b, length), -1, np.int8)
    elig = np.zeros((b, length), bool)
    for i, (s, mode) in enumerate(zip(samples, modes)):
        n = len(s.ids)
        ids[i, :n] = s.ids
        seg[i, :n] = s.segment
        roles = np.frombuffer("".join(s.role).encode(), np.uint8)
        want = {"answer": b"a", "query": b"q", "all": b"pqa"}[mode]
        elig[i, :n] = np.isin(roles, np.frombuffer(want, np.uint8))
    t = t_min + (1 - t_min) * ((nrng.random() + np.arange(b)) / b)[nrng.permutation(b)]
    masked = (nrng.random((b, length)) < t[:, None]) & elig
    none = ~masked.any(axis=1)
    first = elig.argmax(axis=1)
    masked[none, first[none]] = elig[none, first[none]]
    weights = (masked / np.maximum(masked.sum(axis=1, keepdims=True), 1)).astype(np.float32)
    inputs = np.where(masked, data.MASK, ids).astype(np.uint8)
    return {"inputs": inputs, "targets": ids, "weights": weights, "segments": seg}


def make_step_batch(seed: int, step: int, steps: int, token_budget: int, window: int) -> dict:
    """The batch of ``step``: a pure function of (seed, step), so a resumed run draws the same data."""
    rng = random.Random(f"{seed}-{step}")
    n, stage = stage_at(step, steps)
    length = rng.choice([b for b in stage.buckets if b <= window])
    kinds, weights = zip(*((k, w) for w, k in stage.mix))
    samples, modes = [], []
    while len(samples) < max(2, token_budget // length):
        total = rng.randint(max(96, length // 2), length - 8)
        s, mode = draw_sample(rng, rng.choices(kinds, weights=weights)[0], total)
        if len(s.ids) <= length:
            samples.append(s)
            modes.append(mode)
    batch = mask_batch(samples, modes, length, np.random.default_rng([seed, step]))
    batch["stage"] = n
    return batch


class Prefetcher:
    """Batches of steps ``first, first+1, ...`` drawn ahead by ``workers`` processes (spawned: safe beside
    CUDA), at most ``workers * ahead`` in flight; ``workers=0`` draws them in this process."""

    def __init__(self, corpus_dir: str, first: int, args, workers: int, ahead: int = 3):
        self.args, self.next_step, self.pending = args, first, []
        self.depth = max(1, workers * ahead)
        self.pool = None
        if workers > 0:
            import multiprocessing as mp

            self.pool = mp.get_context("spawn").Pool(workers, initializer=init_worker, initargs=(corpus_dir,))
        else:
            init_worker(corpus_dir)

    def _submit(self):
        a = (self.args.seed, self.next_step, self.args.steps, self.args.token_budget, self.args.window)
        self.pending.append(self.pool.apply_async(make_step_batch, a) if self.pool else a)
        self.next_step += 1

    def get(self) -> dict:
        """The next step's batch (blocks until a worker has it)."""
        while len(self.pending) < (self.depth if self.pool else 1):
            self._submit()
        item = self.pending.pop(0)
        return item.get() if self.pool else make_step_batch(*item)

    def close(self):
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


# ---- the step -----------------------------------------------------------------------------------------


def to_device(batch: dict, device: torch.device):
    """The batch's tensors on ``device``: int64 inputs/targets, float32 weights, positions [B, L], and the
    attention mask [B, L, L] bool built there (static rows see their own segment, live rows and pads every
    valid key: ``bench.tiny.train.make_batch``'s rule)."""
    pin = device.type == "cuda"

    def move(x):
        t = torch.from_numpy(x)
        return (t.pin_memory() if pin else t).to(device, non_blocking=True)

    inputs, targets = move(batch["inputs"]).long(), move(batch["targets"]).long()
    weights, seg = move(batch["weights"]), move(batch["segments"])
    valid = seg >= 0
    attn = valid[:, None, :] & ((seg[:, :, None] == seg[:, None, :]) | (seg <= 0)[:, :, None])
    b, n = inputs.shape
    pos = torch.arange(n, device=device).expand(b, n)
    return inputs, targets, weights, pos, attn


def train_step(model, opt, batch_t, vocab: int, lr: float, bf16: bool, acc: torch.Tensor) -> None:
    """One optimiser step; adds (loss, grad norm, masked CE sum, masked count, 1) into ``acc`` on the device
    (no host sync)."""
    inputs, targets, weights, pos, attn = batch_t
    for g in opt.param_groups:
        g["lr"] = lr
    with torch.autocast(inputs.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(inputs, pos, attention_mask=attn).logits
    ce = F.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1), reduction="none").view_as(weights)
    loss = (ce * weights).sum() / weights.shape[0]
    opt.zero_grad(set_to_none=True)
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
    opt.step()
    on = (weights > 0).float()
    acc += torch.stack([loss.detach(), gnorm.detach().float(), (ce.detach() * on).sum(), on.sum(), on.new_ones(())])


# ---- state files --------------------------------------------------------------------------------------


def n_params(arch: dict, vocab: int) -> int:
    """Parameters of a Dream layout of ``arch`` (q/k/v with bias, o without, SwiGLU, 2 RMSNorms a layer,
    final norm, untied embedding and head)."""
    d, f, hq, hkv = (
        arch[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads")
    )
    kv = d // hq * hkv
    layer = d * d + d + 2 * (d * kv + kv) + d * d + 3 * d * f + 2 * d
    return arch["num_hidden_layers"] * layer + 2 * vocab * d + d


def check_fits(arch: dict, vocab: int) -> int:
    """Shards the training state of ``arch`` needs; raises :class:`SizeError` past :data:`MAX_SHARDS`."""
    need = math.ceil(n_params(arch, vocab) * STATE_BYTES_PER_PARAM / SHARD_BYTES)
    if need > MAX_SHARDS:
        raise SizeError(
            f"{n_params(arch, vocab) / 1e6:.1f}M parameters need {need} state shards of 15 MiB; at most "
            f"{MAX_SHARDS} fit the 8 output files (~{MAX_SHARDS * SHARD_BYTES // STATE_BYTES_PER_PARAM / 1e6:.1f}M)"
        )
    return need


def _folder_bytes(folder: str) -> int:
    return sum(e.stat().st_size for e in os.scandir(folder) if e.is_file()) if os.path.isdir(folder) else 0


def save_state(out: str, model, opt, meta: dict) -> list[str]:
    """Write the shards and run.json into ``out`` (each file written under a temporary name, then renamed;
    shards of an older, larger state removed); returns the shard names."""
    from safetensors.torch import save_file

    tensors = {}
    names = {id(p): n for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        tensors[f"model/{n}"] = p.detach().float().cpu().contiguous()
    for p, st in opt.state.items():
        for key in ("exp_avg", "exp_avg_sq"):
            tensors[f"{key}/{names[id(p)]}"] = st[key].detach().to(torch.bfloat16).cpu().contiguous()
    groups, size = [[]], 0
    for k, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if groups[-1] and size + nbytes > SHARD_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(k)
        size += nbytes
    files = [f"state-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    for name, keys in zip(files, groups):
        save_file({k: tensors[k] for k in keys}, os.path.join(out, name + ".tmp"))
        os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))
    meta = meta | {"shards": files}
    with open(os.path.join(out, "run.json.tmp"), "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(os.path.join(out, "run.json.tmp"), os.path.join(out, "run.json"))
    for old in os.listdir(out):
        if old.startswith("state-") and old.endswith(".safetensors") and old not in files:
            os.remove(os.path.join(out, old))
    return files


def load_state(folder: str) -> tuple[dict, dict]:
    """(run.json, {tensor name: tensor}) of a saved state. Raises ``FileNotFoundError`` for a missing
    run.json or shard."""
    from safetensors.torch import load_file

    path = os.path.join(folder, "run.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{folder} holds no run.json: not a gpu_run state")
    with open(path) as f:
        meta = json.load(f)
    tensors = {}
    for name in meta["shards"]:
        tensors |= load_file(os.path.join(folder, name))
    return meta, tensors


# ---- the run ------------------------------------------------------------------------------------------


def run(args) -> int:
    """Train (or resume) until ``--steps`` or ``--budget-s`` seconds; writes the state, run.json and loss.csv
    into ``--out``. Returns the step reached."""
    t_start = time.time()
    device = torch.device(args.device)
    bf16 = device.type == "cuda" if args.bf16 is None else args.bf16
    torch.manual_seed(args.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    meta, tensors = load_state(args.resume) if args.resume else (None, None)
    arch = arch_of(args, meta["arch"] if meta else None)
    vocab = 4 + len(data.CHAR_ID)
    check_fits(arch, vocab)
    carried = n_params(arch, vocab) * STATE_BYTES_PER_PARAM + _folder_bytes(args.corpus)
    if carried > CARRY_BYTES:
        print(
            f"note: state + corpus are {carried / 2**20:.0f} MiB, over the {CARRY_BYTES >> 20} MiB the device tool "
            "carries: this run resumes only on a machine that still holds its state",
            flush=True,
        )
    if meta and meta["steps"] != args.steps:
        raise SizeError(f"--steps {args.steps} differs from the resumed run's {meta['steps']} (its lr schedule)")
    model = _init_model(vocab, arch).to(device)
    opt = torch.optim.AdamW(
        model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=device.type == "cuda"
    )
    first = 0
    os.makedirs(args.out, exist_ok=True)
    log_path = os.path.join(args.out, "loss.csv")
    if meta:
        model.load_state_dict({k[len("model/") :]: v for k, v in tensors.items() if k.startswith("model/")})
        names = [n for n, _ in model.named_parameters()]
        st = {
            i: {
                "step": torch.tensor(float(meta["adam_step"])),
                "exp_avg": tensors[f"exp_avg/{n}"].float(),
                "exp_avg_sq": tensors[f"exp_avg_sq/{n}"].float(),
            }
            for i, n in enumerate(names)
        }
        opt.load_state_dict({"state": st, "param_groups": opt.state_dict()["param_groups"]})
        first = meta["step"]
        if os.path.abspath(args.resume) != os.path.abspath(args.out):
            with open(os.path.join(args.resume, "loss.csv")) as src, open(log_path, "w") as dst:
                dst.write(src.read())
        print(f"resumed at step {first} from {args.resume}", flush=True)
    else:
        with open(log_path, "w", newline="") as f:
            csv.writer(f).writerow(LOG_FIELDS)
    machine = f"torch {torch.__version__}, {os.cpu_count()} CPUs" + (
        f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ", no GPU"
    )
    calls = (meta or {}).get("calls", []) + [{"first_step": first, "machine": machine, "workers": args.workers}]
    p = n_params(arch, vocab)
    print(f"model: {p / 1e6:.2f}M parameters {arch}; {args.workers} workers; bf16 {bf16}; device {device}", flush=True)
    prefetch = Prefetcher(args.corpus, first, args, args.workers)
    acc = torch.zeros(5, device=device)
    tokens, t_log, step = 0, time.time(), first
    end = args.steps if args.stop_at is None else min(args.steps, args.stop_at)
    last_save = time.time()

    def save():
        calls[-1] |= {"last_step": step, "seconds": round(time.time() - t_start, 1)}
        adam_step = int(next(iter(opt.state.values()))["step"]) if opt.state else 0
        save_state(
            args.out,
            model,
            opt,
            {
                "step": step,
                "steps": args.steps,
                "arch": arch,
                "adam_step": adam_step,
                "params": p,
                "seed": args.seed,
                "token_budget": args.token_budget,
                "window": args.window,
                "lr": args.lr,
                "calls": calls,
            },
        )

    try:
        while step < end and time.time() - t_start < args.budget_s:
            batch = prefetch.get()
            bt = to_device(batch, device)
            tokens += batch["inputs"].size
            lr = lr_at(step, args.steps, args.lr, warmup=args.warmup)
            train_step(model, opt, bt, vocab, lr, bf16, acc)
            step += 1
            if step % args.log_every == 0 or step == end:
                loss, gnorm, ce_sum, n_masked, n = acc.tolist()  # the one host sync per log interval
                now = time.time()
                row = [
                    step,
                    batch["stage"],
                    tokens,
                    f"{loss / n:.4f}",
                    f"{gnorm / n:.3f}",
                    f"{ce_sum / max(n_masked, 1):.4f}",
                    f"{now - t_start:.1f}",
                    f"{tokens / (now - t_log):.0f}",
                ]
                with open(log_path, "a", newline="") as f:
                    csv.writer(f).writerow(row)
                print(" ".join(f"{k}={v}" for k, v in zip(LOG_FIELDS, row)), flush=True)
                acc.zero_()
                tokens, t_log = 0, now
            if time.time() - last_save > args.save_every_s:
                save()
                last_save = time.time()
    finally:
        prefetch.close()
    save()
    print(f"stopped at step {step} of {args.steps} after {time.time() - t_start:.0f} s; state in {args.out}")
    return step


def export(state: str, model_dir: str) -> None:
    """Write an HF-format checkpoint (config.json, model.safetensors, tokenizer files, generation_config.json)
    of the weights in ``state`` (a gpu_run output folder) into ``model_dir``."""
    from bench.tiny.tokenizer import save_char_tokenizer
    from bench.tiny.train import export as train_export

    meta, tensors = load_state(state)
    os.makedirs(model_dir, exist_ok=True)
    vocab = len(save_char_tokenizer(model_dir))
    model = _init_model(vocab, meta["arch"])
    model.load_state_dict({k[len("model/") :]: v for k, v in tensors.items() if k.startswith("model/")})
    # the same config.json, generation_config.json and weights as a CPU-trained checkpoint; a GPU run starts from
    # random weights (init=None), so there is no initial prefilling_config.json to carry over
    train_export(model, argparse.Namespace(out=model_dir, window=meta["window"], arch=meta["arch"], init=None), vocab)


def parse_args(argv=None) -> argparse.Namespace:
    """The flags of ``python -m bench.tiny.gpu_run`` (training)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder of the state shards, run.json and loss.csv")
    p.add_argument("--corpus", default="bench/tiny/corpus_build", help="packed corpus (python -m bench.tiny.corpus)")
    p.add_argument("--resume", default=None, help="continue from this state folder (a previous --out)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=6000, help="steps of the whole run (the lr schedule's length)")
    p.add_argument("--stop-at", type=int, default=None, help="stop before this step (schedule unchanged)")
    p.add_argument("--budget-s", type=float, default=510.0, help="stop (and save) after this many seconds")
    p.add_argument("--save-every-s", type=float, default=120.0)
    p.add_argument("--token-budget", type=int, default=65536, help="tokens per step (rows = budget // length)")
    p.add_argument("--window", type=int, default=1536, help="longest training sequence (tokens)")
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (warm-up, cosine to 10%%)")
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--workers", type=int, default=8, help="batch-drawing processes (0: in this process)")
    p.add_argument("--log-every", type=int, default=25, help="steps per loss.csv row (one host sync each)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bf16", dest="bf16", action="store_true", default=None, help="bf16 autocast (default on CUDA)")
    p.add_argument("--no-bf16", dest="bf16", action="store_false")
    size = p.add_argument_group("model size (from scratch; a resumed run keeps its own)")
    defaults = dict(GPU_SIZE)
    for key, flag in ARCH_FLAGS.items():
        size.add_argument(flag, dest=key, type=int, default=None, help=f"{key} (default {defaults[key]})")
    args = p.parse_args(argv)
    args.init = None
    args.size_defaults = defaults
    return args


def main(argv=None) -> int:
    """``export --state S --model M`` or a training run; a size or flag error is one ``error:`` line, exit 2."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["export"]:
            p = argparse.ArgumentParser(prog="python -m bench.tiny.gpu_run export")
            p.add_argument("--state", required=True)
            p.add_argument("--model", required=True)
            a = p.parse_args(argv[1:])
            export(a.state, a.model)
            return 0
        args = parse_args(argv)
        if args.resume is None:  # a fresh run: the GPU sizes unless a flag says otherwise
            for key, value in args.size_defaults.items():
                if getattr(args, key) is None:
                    setattr(args, key, value)
        run(args)
    except (SizeError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


assert set(ARCH) >= set(ARCH_FLAGS)

if __name__ == "__main__":
    raise SystemExit(main())
