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

The mask token is never a choice: its logit is set to ``-inf`` before anything else, so every
distribution above is over the real tokens only and a revealed position never holds the mask id
(the references let the model pick it; they write it back and the position stays masked).

One step for the whole batch (:func:`unmask_batch`): every tensor is ``[B, L]`` (rows x the block's
positions), non-candidate positions are carried along and masked out, and the per-row reveal counts
are device tensors, so a step has fixed shapes, no Python loop over rows and no host-device
synchronisation. A position is chosen by its rank among its row's candidates (a stable sort of the
masked confidences, then ``rank < k``). Greedy decoding (temperature 0, no ``alg_temp``) chooses
exactly what the per-row formulation chooses (tested against it, ``tests/unmasking_reference.py``).

Random draws (one ``torch.Generator`` for the batch, fixed shapes, in this order within a step):
  1. tokens, when temperature > 0: one ``torch.rand`` of ``[B, L, V]`` (row-major: row, position,
     token); the token is ``argmax(p / -log u)`` (the exponential race, the same distribution as a
     categorical draw from ``p``; Gumbel-max in another form);
  2. positions: ``random``: one ``torch.rand`` ``[B, L]`` as the confidence; ``origin``: one
     ``torch.rand`` ``[B, L]``, position revealed when ``u < p``; Dream's rules with ``alg_temp``: one
     ``torch.rand`` ``[B, L]`` turned into Gumbel noise added to ``confidence / alg_temp``, top-k of
     that (Gumbel-top-k: sampling k positions without replacement from ``softmax(conf / alg_temp)``,
     Kool et al. 2019).
Draws are made for every position, candidates or not, so a row's draws depend on the batch shape
and sampled outputs differ from the same request decoded alone (and from the references' draws:
``torch.multinomial`` over the candidates only); same seed and shapes give the same output.
"""

from __future__ import annotations

import math
import numbers
import operator
from dataclasses import dataclass
from typing import NamedTuple

import torch

DREAM_ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")
LLADA_ALGS = ("low_confidence", "random")
ALGS = DREAM_ALGS + LLADA_ALGS + ("confidence_threshold",)
CONFIDENCE_SOURCES = ("tempered", "logits")


def integer(name: str, value) -> int:
    """``value`` as a Python int: an int or a numpy integer; a bool or a float (even ``8.0``) is a TypeError
    naming ``name`` (a float count would be truncated or fail deep inside torch)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    return operator.index(value)


def real_number(name: str, value) -> float:
    """``value`` as a Python float: an int, float or numpy real; a bool, a string or a tensor is a TypeError
    naming ``name``. Range checks (NaN, inf) are the caller's."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    return float(value)


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
        TypeError: temperature, top_p, alg_temp, eps or threshold not a real number, top_k not an
            integer (a bool is neither; numpy scalars are accepted).
        ValueError: unknown alg or confidence source, temperature not finite or < 0, top_p outside
            (0, 1], top_k < 1, alg_temp not finite or < 0, eps outside (0, 1), threshold outside (0, 1]
            (NaN is outside every range).
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
        for name in ("temperature", "top_p", "alg_temp", "eps", "threshold"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, real_number(name, value))
        if self.top_k is not None:
            object.__setattr__(self, "top_k", integer("top_k", self.top_k))
        # written as "not (in range)" so that NaN, which fails every comparison, is refused too
        if not 0 <= self.temperature < math.inf:  # inf: every tempered distribution is NaN
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.alg_temp is not None and not 0 <= self.alg_temp < math.inf:
            raise ValueError(f"alg_temp must be a finite number >= 0 (0 or None: top-k positions), got {self.alg_temp}")
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


def _uniform(shape, like: torch.Tensor, generator) -> torch.Tensor:
    """``torch.rand`` in ``(0, 1)`` (a 0 is raised to the smallest normal float: ``-log u`` stays finite)."""
    u = torch.rand(shape, generator=generator, device=like.device, dtype=torch.float32)
    return u.clamp_(min=torch.finfo(torch.float32).tiny)


def choose_tokens(logits: torch.Tensor, cfg: UnmaskingConfig, generator=None, *, mask_id: int | None = None):
    """Candidate tokens, and the distribution their confidence is read from, at every position.

    Args:
        logits: ``[..., V]`` (any float dtype; computed in fp32; not modified).
        cfg: temperature / top_p / top_k / confidence_from.
        generator: torch.Generator for sampling (None = global RNG); one ``torch.rand`` of the
            logits' shape when temperature > 0 (see the module docstring).
        mask_id: the mask token id, whose logit is set to ``-inf`` first (never chosen); None = keep it.

    Returns:
        (x0 ``[...]`` int64, probs ``[..., V]`` fp32, invalid ``[...]`` bool): x0 is drawn from
        (temperature 0: the argmax of) the filtered, tempered distribution; probs is that
        distribution when ``cfg.confidence_from == "tempered"``, else ``softmax(logits)``; invalid
        marks positions whose distribution is NaN (a NaN or +inf logit, or no finite logit), where x0
        means nothing.
    """
    src = logits
    logits = logits.float()
    if mask_id is not None:
        logits = logits.clone() if logits is src else logits
        logits[..., mask_id] = float("-inf")
    tempered = logits / cfg.temperature if cfg.temperature > 0 else logits
    filtered = _filter_logits(tempered, cfg.top_p, cfg.top_k)
    probs = torch.softmax(filtered, dim=-1)
    if cfg.temperature > 0:  # exponential race: argmax p / E with E ~ Exp(1) is a draw from p
        x0 = (probs / _uniform(probs.shape, probs, generator).log_().neg_()).argmax(dim=-1)
    else:
        x0 = probs.argmax(dim=-1)
    invalid = probs.gather(-1, x0[..., None]).squeeze(-1).isnan()
    if cfg.confidence_from == "logits" and filtered is not logits:  # else probs is softmax(logits) already
        probs = torch.softmax(logits, dim=-1)
    return x0, probs, invalid


def confidence_of(alg: str, probs: torch.Tensor, x0: torch.Tensor, generator=None) -> torch.Tensor:
    """Per-position confidence ``[...]`` fp32 used to rank positions (higher = reveal first).

    ``probs`` ``[..., V]`` is the distribution of :func:`choose_tokens`; ``x0`` ``[...]`` the chosen
    tokens; ``random`` draws one ``torch.rand`` of ``x0``'s shape from ``generator``.
    """
    if alg == "topk_margin":
        top2 = torch.topk(probs, min(2, probs.shape[-1]), dim=-1).values
        return top2[..., 0] - (top2[..., 1] if top2.shape[-1] > 1 else 0)
    if alg == "entropy":
        return (probs * torch.log(probs + 1e-10)).sum(dim=-1)
    if alg == "random":
        return _uniform(x0.shape, probs, generator)
    return probs.gather(-1, x0[..., None]).squeeze(-1)


def most_confident(conf: torch.Tensor, k: int) -> torch.Tensor:
    """Indices ``[k]`` of the ``k`` highest of ``conf`` ``[N]``; ties go to the lower index (leftmost).

    A stable descending sort, so the choice among equal confidences is defined (``torch.topk``
    leaves it unspecified) and the same on every device.
    """
    return torch.sort(conf, descending=True, stable=True).indices[:k]


def top_ranked(conf: torch.Tensor, candidates: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The ``k[b]`` most confident candidates of each row, as a mask; the batched :func:`most_confident`.

    Args:
        conf: ``[B, L]`` float confidences.
        candidates: ``[B, L]`` bool, the positions that may be chosen.
        k: ``[B]`` int64 per-row counts (more than a row's candidates: all of them).

    Returns:
        ``[B, L]`` bool. Ranks count candidates only, in the order of a stable descending sort of
        ``conf`` (ties: leftmost first), so row b gets what ``most_confident(conf[b, cand_b], k[b])``
        gives; fixed shapes, no host read.
    """
    order = torch.sort(conf.masked_fill(~candidates, float("-inf")), dim=1, descending=True, stable=True).indices
    cand_sorted = candidates.gather(1, order)
    take = cand_sorted & (cand_sorted.cumsum(dim=1) <= k[:, None])
    return torch.zeros_like(candidates).scatter(1, order, take)


def llada_schedule(n_masked: int, steps: int) -> list[int]:
    """LLaDA's per-step reveal counts: ``n // steps`` each, remainder to the first steps."""
    base, rem = divmod(n_masked, steps)
    return [base + (1 if i < rem else 0) for i in range(steps)]


def dream_ratio(step: int, steps: int, eps: float) -> float:
    """Share of the masks Dream reveals at ``step`` of ``linspace(1, eps, steps+1)``: ``1 - t_{i+1}/t_i``
    (1 at the last step)."""
    if step >= steps - 1:
        return 1.0
    t = 1 - step * (1 - eps) / steps
    s = 1 - (step + 1) * (1 - eps) / steps
    return 1 - s / t


def dream_count(n_masked: int, step: int, steps: int, eps: float) -> int:
    """Dream's reveal count at ``step`` of the linear schedule ``linspace(1, eps, steps+1)``."""
    if step >= steps - 1:
        return n_masked
    return int(n_masked * dream_ratio(step, steps, eps))


class StepChoice(NamedTuple):
    """One denoising step's decision for a batch: write ``where(reveal, tokens, resp)``.

    Attributes:
        tokens: ``[B, L]`` int64 chosen tokens (meaningful where ``reveal``).
        reveal: ``[B, L]`` bool, candidates revealed this step.
        invalid: ``[B, L]`` bool, candidates whose distribution was NaN (see :func:`choose_tokens`).
    """

    tokens: torch.Tensor
    reveal: torch.Tensor
    invalid: torch.Tensor


def unmask_batch(
    logits: torch.Tensor,
    candidates: torch.Tensor,
    cfg: UnmaskingConfig,
    step: int,
    steps: int,
    *,
    block_masks: torch.Tensor | None = None,
    mask_id: int | None = None,
    generator=None,
) -> StepChoice:
    """One denoising step's decision for every row of a batch at once.

    Args:
        logits: ``[B, L, V]`` logits of the block's positions (any float dtype; not modified).
        candidates: ``[B, L]`` bool, masked positions this step may reveal (the current block).
        cfg: the rule.
        step, steps: index of this step within the block and the block's step budget (Dream's
            schedule and LLaDA's quotas; ignored by ``confidence_threshold``).
        block_masks: ``[B]`` int64, each row's masked positions at the block's start (LLaDA's quotas,
            :func:`llada_schedule`, are computed from it on the device); required for LLaDA's rules.
        mask_id: the mask token id, never chosen (see :func:`choose_tokens`).
        generator: torch.Generator for every random choice (draw order: the module docstring).

    Returns:
        :class:`StepChoice`. Per row the rules of the module docstring: Dream's count
        ``int(n * ratio)`` of the row's n candidates (in float64 on the device, as the host's
        :func:`dream_count`), LLaDA's quota, capped at n; ``confidence_threshold`` every candidate
        with confidence >= tau plus the most confident one; ``origin`` each candidate with
        probability ``ratio``. No host-device synchronisation, no Python loop over rows.

    Raises:
        ValueError: a LLaDA rule without ``block_masks``.
    """
    x0, probs, invalid = choose_tokens(logits, cfg, generator, mask_id=mask_id)
    invalid = invalid & candidates
    if cfg.alg == "origin":
        reveal = candidates & (_uniform(candidates.shape, probs, generator) < dream_ratio(step, steps, cfg.eps))
        return StepChoice(x0, reveal, invalid)
    conf = confidence_of(cfg.alg, probs, x0, generator)
    if cfg.alg == "confidence_threshold":
        best = conf.masked_fill(~candidates, float("-inf")).argmax(dim=1, keepdim=True)  # first maximum
        pick = (conf >= cfg.threshold).scatter(1, best, True)
        return StepChoice(x0, candidates & pick, invalid)
    n = candidates.sum(dim=1)
    if cfg.alg in LLADA_ALGS:
        if block_masks is None:
            raise ValueError(f"{cfg.alg} needs block_masks (each row's masks at the block's start)")
        k = block_masks // steps + (step < block_masks % steps).long()
    elif step >= steps - 1:
        k = n
    else:  # the host's int(n * ratio): an exact float64 product, truncated (n >= 0)
        k = (n.to(torch.float64) * dream_ratio(step, steps, cfg.eps)).floor().long()
    k = torch.minimum(k, n)
    if cfg.alg in DREAM_ALGS and cfg.alg_temp:  # Gumbel-top-k on softmax(conf / alg_temp)
        gumbel = -_uniform(candidates.shape, probs, generator).log_().neg_().log_()
        conf = conf / cfg.alg_temp + gumbel
    return StepChoice(x0, top_ranked(conf, candidates, k), invalid)
