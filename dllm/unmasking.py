"""Unmasking rules: which masked positions a denoising step fills, and with which tokens.

Rules (algorithms as described by their projects, code our own):

Dream (``Dream-org/Dream`` ``diffusion_generate``), linear schedule ``t_i = linspace(1, eps, steps+1)``:
  - ``origin``: every masked position is revealed independently with probability
    ``1 - t_{i+1}/t_i`` (1 at the last step), token sampled from its distribution.
  - ``maskgit_plus``: reveal ``int(n_mask * (1 - t_{i+1}/t_i))`` positions (all at the last
    step) with the highest top-1 probability.
  - ``topk_margin``: same count, confidence = top1 - top2 probability.
  - ``entropy``: same count, confidence = sum p log p (negative entropy).
  With ``alg_temp > 0`` the positions are sampled from ``softmax(confidence / alg_temp)``
  instead of taken by top-k.
LLaDA (``ML-GSAI/LLaDA`` ``generate``), semi-autoregressive blocks:
  - ``low_confidence``: reveal ``mask_num // steps`` positions per step (the remainder goes
    to the first steps) with the highest probability of the chosen token.
  - ``random``: same count, positions chosen uniformly at random.
Fast-dLLM (``NVlabs/Fast-dLLM``, parallel decoding):
  - ``confidence_threshold``: reveal every masked position whose chosen token has
    probability >= ``threshold``; at least the single most confident one per step.

Token choice: temperature 0 -> argmax (deterministic); temperature > 0 -> a sample
from ``softmax(logits / T)`` after optional top-p / top-k filtering (Dream); LLaDA's
Gumbel-max trick samples the same distribution.

Confidence (``confidence_from``): the distribution the rank of a position is read from.
  - ``tempered``: the filtered ``softmax(logits / T)`` the token was drawn from. Dream's
    reference does this, so the default for its rules. At low temperature this distribution
    is nearly one-hot, every slot reports a confidence of about 1.0, and the order of
    revealing falls to the tie rule (left to right).
  - ``logits``: the model's own ``softmax(logits)``, untempered and unfiltered. LLaDA's and
    Fast-dLLM's references rank by it, so the default for ``low_confidence``, ``random`` and
    ``confidence_threshold``; an option for Dream's rules whose ranks should not depend on T.
  At temperature 0 without top-p / top-k both are the same distribution.

Tie rule: positions of equal confidence are revealed leftmost first (a stable descending sort;
``confidence_threshold``'s fallback takes the first maximum), so fully saturated confidences
reveal left to right, like autoregressive decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DREAM_ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")
LLADA_ALGS = ("low_confidence", "random")
ALGS = DREAM_ALGS + LLADA_ALGS + ("confidence_threshold",)
CONFIDENCE_SOURCES = ("tempered", "logits")


def default_confidence_from(alg: str) -> str:
    """The confidence source of ``alg``'s reference project: ``tempered`` for Dream's rules,
    ``logits`` for LLaDA's and Fast-dLLM's (their references rank by ``softmax(logits)``)."""
    return "tempered" if alg in DREAM_ALGS else "logits"


@dataclass(frozen=True)
class UnmaskingConfig:
    """Parameters of an unmasking rule.

    Attributes:
        alg: one of :data:`ALGS`.
        temperature: 0 = greedy; > 0 samples tokens.
        top_p: nucleus filtering (Dream), None = off.
        top_k: top-k filtering (Dream), None = off.
        alg_temp: Dream's position-sampling temperature; None/0 = top-k positions.
        eps: Dream's final time of the linear schedule.
        threshold: tau of ``confidence_threshold``.
        confidence_from: ``tempered`` or ``logits`` (see the module docstring); None = the
            rule's reference (:func:`default_confidence_from`).

    Raises:
        ValueError: unknown alg or confidence source, temperature < 0, top_p outside (0, 1],
            top_k < 1, eps outside (0, 1), threshold outside (0, 1].
    """

    alg: str = "maskgit_plus"
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    alg_temp: float | None = None
    eps: float = 1e-3
    threshold: float = 0.9
    confidence_from: str | None = None

    def __post_init__(self):
        if self.alg not in ALGS:
            raise ValueError(f"unknown unmasking alg {self.alg!r}; choose from {ALGS}")
        if self.confidence_from is None:
            object.__setattr__(self, "confidence_from", default_confidence_from(self.alg))
        if self.confidence_from not in CONFIDENCE_SOURCES:
            raise ValueError(f"confidence_from must be one of {CONFIDENCE_SOURCES}, got {self.confidence_from!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if not 0 < self.eps < 1:
            raise ValueError(f"eps must be in (0, 1), got {self.eps}")
        if not 0 < self.threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")

    @property
    def fixed_steps(self) -> bool:
        """False for ``confidence_threshold``, whose step count depends on the model."""
        return self.alg != "confidence_threshold"


def _filter_logits(logits: torch.Tensor, top_p, top_k) -> torch.Tensor:
    if top_p is not None and top_p < 1:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        drop_sorted = cum > top_p
        drop_sorted[..., 1:] = drop_sorted[..., :-1].clone()  # keep the token that crosses top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return logits


def choose_tokens(logits: torch.Tensor, cfg: UnmaskingConfig, generator=None):
    """Candidate tokens, and the distribution their confidence is read from, for masked positions.

    Args:
        logits: ``[N, V]`` (any float dtype; computed in fp32).
        cfg: temperature / top_p / top_k / confidence_from.
        generator: torch.Generator for sampling (None = global RNG).

    Returns:
        (x0 ``[N]`` int64, probs ``[N, V]`` fp32): x0 is drawn from (temperature 0: the argmax of)
        the filtered, tempered distribution; probs is that distribution when
        ``cfg.confidence_from == "tempered"``, else ``softmax(logits)``.
    """
    logits = logits.float()
    tempered = logits / cfg.temperature if cfg.temperature > 0 else logits
    filtered = _filter_logits(tempered, cfg.top_p, cfg.top_k)
    probs = torch.softmax(filtered, dim=-1)
    if cfg.temperature > 0:
        x0 = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    else:
        x0 = probs.argmax(dim=-1)
    if cfg.confidence_from == "logits" and filtered is not logits:  # else probs is softmax(logits) already
        probs = torch.softmax(logits, dim=-1)
    return x0, probs


def confidence_of(alg: str, probs: torch.Tensor, x0: torch.Tensor, generator=None) -> torch.Tensor:
    """Per-position confidence ``[N]`` fp32 used to rank positions (higher = reveal first).

    ``probs`` ``[N, V]`` is the distribution of :func:`choose_tokens`; ``x0`` ``[N]`` the chosen tokens.
    """
    if alg == "topk_margin":
        top2 = torch.topk(probs, min(2, probs.shape[-1]), dim=-1).values
        return top2[:, 0] - (top2[:, 1] if top2.shape[1] > 1 else 0)
    if alg == "entropy":
        return (probs * torch.log(probs + 1e-10)).sum(dim=-1)
    if alg == "random":
        return torch.rand(x0.shape, generator=generator, device=x0.device)
    return probs.gather(-1, x0[:, None]).squeeze(-1)


def most_confident(conf: torch.Tensor, k: int) -> torch.Tensor:
    """Indices ``[k]`` of the ``k`` highest of ``conf`` ``[N]``; ties go to the lower index (leftmost).

    A stable descending sort, so the choice among equal confidences is defined (``torch.topk``
    leaves it unspecified) and the same on every device.
    """
    return torch.sort(conf, descending=True, stable=True).indices[:k]


def llada_schedule(n_masked: int, steps: int) -> list[int]:
    """LLaDA's per-step reveal counts: ``n // steps`` each, remainder to the first steps."""
    base, rem = divmod(n_masked, steps)
    return [base + (1 if i < rem else 0) for i in range(steps)]


def dream_count(n_masked: int, step: int, steps: int, eps: float) -> int:
    """Dream's reveal count at ``step`` of the linear schedule ``linspace(1, eps, steps+1)``."""
    if step >= steps - 1:
        return n_masked
    t = 1 - step * (1 - eps) / steps
    s = 1 - (step + 1) * (1 - eps) / steps
    return int(n_masked * (1 - s / t))


def unmask_step(
    logits: torch.Tensor,
    candidates: torch.Tensor,
    cfg: UnmaskingConfig,
    step: int,
    steps: int,
    quota: int | None = None,
    generator=None,
):
    """One denoising step's decision for one sequence.

    Args:
        logits: ``[L, V]`` logits of the response positions.
        candidates: ``[L]`` bool, masked positions this step may reveal (current block).
        cfg: the rule.
        step, steps: index of this step within the block and the block's step budget
            (Dream's schedule; ignored by ``confidence_threshold``).
        quota: reveal count for LLaDA rules (from :func:`llada_schedule`).
        generator: torch.Generator for every random choice.

    Returns:
        (tokens ``[L]`` int64, reveal ``[L]`` bool): write ``tokens[reveal]``.
    """
    L = candidates.shape[0]
    reveal = torch.zeros(L, dtype=torch.bool, device=candidates.device)
    tokens = torch.zeros(L, dtype=torch.long, device=candidates.device)
    idx = candidates.nonzero().squeeze(-1)
    n = idx.numel()
    if n == 0:
        return tokens, reveal
    x0, probs = choose_tokens(logits[idx], cfg, generator)
    tokens[idx] = x0
    if cfg.alg == "origin":
        t = 1 - step * (1 - cfg.eps) / steps
        s = 1 - (step + 1) * (1 - cfg.eps) / steps
        p = 1.0 if step >= steps - 1 else 1 - s / t
        pick = torch.rand(n, generator=generator, device=idx.device) < p
        reveal[idx[pick]] = True
        return tokens, reveal
    conf = confidence_of(cfg.alg, probs, x0, generator)
    if cfg.alg == "confidence_threshold":
        pick = conf >= cfg.threshold
        pick[conf.argmax()] = True
        reveal[idx[pick]] = True
        return tokens, reveal
    k = quota if cfg.alg in LLADA_ALGS else dream_count(n, step, steps, cfg.eps)
    k = min(int(k), n)
    if k <= 0:
        return tokens, reveal
    if cfg.alg in DREAM_ALGS and cfg.alg_temp:
        w = torch.softmax(conf / cfg.alg_temp, dim=-1)
        chosen = torch.multinomial(w, k, replacement=False, generator=generator)
    else:
        chosen = most_confident(conf, k)
    reveal[idx[chosen]] = True
    return tokens, reveal
