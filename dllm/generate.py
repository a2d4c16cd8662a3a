"""``dllm.generate``: diffusion decoding with three cache policies.

- ``dense`` (the transformers baseline): every step re-encodes prompt + response.
  Per step ``O((L_p + L_d)^2)`` attention.
- ``prefix_cache`` (Fast-dLLM v1 style prefix caching): at the start of every block
  the whole sequence is encoded once and the K/V of the prompt (all but its last
  ``live_window`` tokens) are kept; each step recomputes only the live block (the
  last prompt tokens + the response) against that cache.
- ``prefilling`` (Prefilling-dLLM, arXiv 2606.10537): see :mod:`dllm.prefilling`.

Greedy decoding (temperature 0) is deterministic; sampling rules draw from a
``torch.Generator`` seeded by ``seed``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dllm.denoise import PhaseTimer, denoise
from dllm.devices import same_device
from dllm.kv_cache import StaticKVCache
from dllm.tokenization import decode_text
from dllm.unmasking import UnmaskingConfig

METHODS = ("dense", "prefix_cache", "prefilling")


@dataclass
class GenerationStats:
    """What a generation cost.

    Attributes:
        nfe: model forwards (network function evaluations), cache builds included.
        steps: denoising steps run.
        seconds: wall-clock seconds per phase: ``prefill`` (building static caches),
            ``scoring`` (prefilling only), ``decode`` (the denoising loop), ``total``.
        extra: method-specific details (prefilling: chunk ids, scores...).
    """

    nfe: int = 0
    steps: int = 0
    seconds: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        total = self.seconds.get("total", 0.0)
        return self.extra.get("gen_tokens", 0) / total if total > 0 else float("nan")


@dataclass
class GenerationResult:
    """Output of :func:`generate`.

    Attributes:
        tokens: ``[B, gen_length]`` int64 response tokens (mask-free).
        stats: :class:`GenerationStats`.
        text: decoded responses cut at EOS (None when the model has no tokenizer).
    """

    tokens: torch.Tensor
    stats: GenerationStats
    text: list | None = None


class DensePolicy:
    """Recompute prompt + response every step (no cache)."""

    def __init__(self, model, prompt: torch.Tensor, timer: PhaseTimer):
        self.model, self.prompt, self.nfe = model, prompt, 0
        self.timer = timer

    def start_block(self, resp, block):
        pass

    def logits(self, resp):
        x = torch.cat([self.prompt, resp], dim=1)
        lp = self.prompt.shape[1]
        with self.timer.phase("decode"):
            out = self.model(x, torch.arange(x.shape[1], device=x.device), logits_start=lp)
        self.nfe += 1
        return out.logits


class PrefixCachePolicy:
    """Prompt K/V cached once per block (or per step); the live block is recomputed each step.

    Args:
        live_window: prompt tokens kept live (>= 1: a shifted model predicts the first
            response token from the last prompt position, which must be recomputed).
        refresh: ``"block"`` (Fast-dLLM: rebuild at each block start) or ``"step"`` (rebuild
            every step; exact w.r.t. ``dense``, used to test the cached attention path).
        scope: ``"sequence"`` encodes prompt + current response to build the cache (Fast-dLLM);
            ``"prompt"`` encodes the cached prompt part alone (reusable across questions).
    """

    def __init__(self, model, prompt, timer, *, live_window=1, refresh="block", scope="sequence"):
        if refresh not in ("block", "step"):
            raise ValueError(f"refresh must be 'block' or 'step', got {refresh!r}")
        if scope not in ("sequence", "prompt"):
            raise ValueError(f"scope must be 'sequence' or 'prompt', got {scope!r}")
        lp = prompt.shape[1]
        if not 1 <= live_window <= lp:
            raise ValueError(f"live_window must be in [1, prompt length {lp}], got {live_window}")
        self.model, self.prompt, self.timer = model, prompt, timer
        self.w, self.refresh, self.scope = live_window, refresh, scope
        self.cache = None
        self.nfe = 0

    def _build(self, resp):
        lp = self.prompt.shape[1]
        n_cached = lp - self.w
        x = torch.cat([self.prompt, resp], dim=1) if self.scope == "sequence" else self.prompt[:, :n_cached]
        with self.timer.phase("prefill"):
            if n_cached == 0:
                self.cache = None
            else:
                out = self.model(x, torch.arange(x.shape[1], device=x.device), logits_start=x.shape[1], return_kv=True)
                self.nfe += 1
                ks = [k[:, :n_cached] for k in out.k]
                vs = [v[:, :n_cached] for v in out.v]
                self.cache = StaticKVCache.single_segment(ks, vs)

    def start_block(self, resp, block):
        if self.refresh == "block":
            self._build(resp)

    def logits(self, resp):
        if self.refresh == "step":
            self._build(resp)
        lp = self.prompt.shape[1]
        live = torch.cat([self.prompt[:, lp - self.w :], resp], dim=1)
        pos = torch.arange(lp - self.w, lp + resp.shape[1], device=live.device)
        with self.timer.phase("decode"):
            out = self.model(live, pos, self.cache, logits_start=self.w)
        self.nfe += 1
        return out.logits


def default_alg(model) -> str:
    """Dream -> ``maskgit_plus``; LLaDA -> ``low_confidence`` (each project's greedy default)."""
    return "low_confidence" if model.family == "llada" else "maskgit_plus"


def check_prompt(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Validate a prompt tensor and return it as ``[B, L]``.

    Raises:
        TypeError: not an integer tensor.
        ValueError: empty prompt, wrong rank, wrong device, ids outside the vocabulary,
            or the mask token inside the prompt.
    """
    if not torch.is_tensor(input_ids):
        raise TypeError(f"input_ids must be a torch.Tensor, got {type(input_ids).__name__}")
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"input_ids must be int64/int32 token ids, got {input_ids.dtype}")
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be a non-empty [B, L] tensor, got shape {tuple(input_ids.shape)}")
    if not same_device(input_ids.device, model.device):
        raise ValueError(f"input_ids are on {input_ids.device} but the model is on {model.device}")
    if (input_ids == model.mask_token_id).any():
        raise ValueError(f"the prompt contains the mask token id {model.mask_token_id}")
    if input_ids.min() < 0 or input_ids.max() >= model.config.vocab_size:
        raise ValueError(f"prompt token ids must be in [0, {model.config.vocab_size})")
    return input_ids.long()


@torch.no_grad()
def generate(
    model,
    input_ids=None,
    *,
    method: str = "dense",
    gen_length: int = 32,
    steps: int | None = None,
    block_length: int | None = None,
    alg: str | None = None,
    temperature: float = 0.0,
    top_p: float | None = None,
    top_k: int | None = None,
    alg_temp: float | None = None,
    eps: float = 1e-3,
    threshold: float = 0.9,
    confidence_from: str | None = None,
    seed: int | None = None,
    live_window: int = 1,
    cache_refresh: str = "block",
    cache_scope: str = "sequence",
    prompt=None,
    prefilling=None,
    progress: bool = False,
) -> GenerationResult:
    """Generate a response with a diffusion LM.

    Args:
        model: a :class:`~dllm.modeling.DiffusionLM` (e.g. from :func:`dllm.load_model`).
        input_ids: prompt ``[B, L_p]`` or ``[L_p]`` int64 on the model's device (for
            ``prefilling`` pass ``prompt`` instead, or the whole prompt as one context).
        method: ``"dense"``, ``"prefix_cache"`` or ``"prefilling"``.
        gen_length: response tokens L_d.
        steps: denoising steps in total (default gen_length: one token per step);
            split evenly over the blocks.
        block_length: semi-autoregressive block size (default gen_length = one block).
        alg: unmasking rule (see :mod:`dllm.unmasking`); default by family.
        temperature, top_p, top_k, alg_temp, eps, threshold: rule parameters.
        confidence_from: ``"tempered"`` (rank positions by the tempered, filtered distribution the
            tokens are drawn from: Dream's reference) or ``"logits"`` (by ``softmax(logits)``: LLaDA's
            and Fast-dLLM's); None = the rule's reference (see :mod:`dllm.unmasking`).
        seed: seeds the sampling RNG (same seed -> same output).
        live_window, cache_refresh, cache_scope: ``prefix_cache`` options (see
            :class:`PrefixCachePolicy`).
        prompt: ``prefilling`` only: a :class:`dllm.prefilling.PromptParts` (prefix,
            context, query token ids).
        prefilling: ``prefilling`` only: a :class:`dllm.prefilling.PrefillingConfig`.
        progress: tqdm progress bars.

    Returns:
        :class:`GenerationResult` (tokens ``[B, gen_length]``, stats, decoded text).

    Raises:
        ValueError: unknown method/alg/confidence_from, ``gen_length % block_length != 0``, ``steps < 1``,
            steps not divisible by the number of blocks, a prompt containing the mask id,
            prompt on another device than the model, options of another method.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {METHODS}")
    if gen_length < 1:
        raise ValueError(f"gen_length must be >= 1, got {gen_length}")
    block_length = gen_length if block_length is None else int(block_length)
    if block_length < 1 or gen_length % block_length:
        raise ValueError(f"gen_length ({gen_length}) must be a positive multiple of block_length ({block_length})")
    steps = gen_length if steps is None else int(steps)
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    n_blocks = gen_length // block_length
    cfg = UnmaskingConfig(
        alg=alg or default_alg(model),
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        alg_temp=alg_temp,
        eps=eps,
        threshold=threshold,
        confidence_from=confidence_from,
    )
    if cfg.fixed_steps and steps % n_blocks:
        raise ValueError(f"steps ({steps}) must be a multiple of the number of blocks ({n_blocks})")
    if method != "prefilling" and (prompt is not None or prefilling is not None):
        raise ValueError("prompt= and prefilling= are options of method='prefilling'")
    generator = None
    if seed is not None:
        generator = torch.Generator(device=model.device).manual_seed(int(seed))

    timer = PhaseTimer(model.device)
    extra = {}
    with timer.phase("total"):
        if method == "prefilling":
            from dllm.prefilling import build_prefilling_policy

            policy, batch, extra = build_prefilling_policy(
                model, input_ids, prompt, prefilling, timer, gen_length=gen_length, progress=progress
            )
        else:
            input_ids = check_prompt(model, input_ids)
            batch = input_ids.shape[0]
            if method == "dense":
                policy = DensePolicy(model, input_ids, timer)
            else:
                policy = PrefixCachePolicy(
                    model, input_ids, timer, live_window=live_window, refresh=cache_refresh, scope=cache_scope
                )
        resp = torch.full((batch, gen_length), model.mask_token_id, dtype=torch.long, device=model.device)
        n_steps = denoise(
            policy,
            resp,
            mask_id=model.mask_token_id,
            block_length=block_length,
            steps_per_block=steps // n_blocks if cfg.fixed_steps else block_length,
            cfg=cfg,
            generator=generator,
            progress=progress,
        )
    stats = GenerationStats(nfe=policy.nfe, steps=n_steps, seconds=dict(timer.seconds), extra=extra)
    stats.extra["gen_tokens"] = batch * gen_length
    return GenerationResult(resp, stats, decode_text(model, resp))
