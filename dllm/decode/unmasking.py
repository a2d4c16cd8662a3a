"""Unmasking rules: which masked positions a denoising step fills, and with which tokens.

(Over 600 lines on purpose: every rule in both draw orders sits in one file, so the official order can be
read beside the official loops it reproduces and the batched order beside it.)

Rules (algorithms as described by their projects, code our own):

Dream (``Dream-org/Dream`` ``diffusion_generate``), linear schedule ``t_i = linspace(1, eps, steps+1)``:
  - ``origin``: every masked position is revealed independently with probability
    ``1 - t_{i+1}/t_i`` (1 at the last step), token sampled from its distribution.
  - ``maskgit_plus``: reveal ``int(n_mask * (1 - t_{i+1}/t_i))`` positions (all at the last
    step) with the highest top-1 probability; the count in float32, as Dream computes it (``n_mask``, ``t``
    and ``t_{i+1}`` float32 tensors; a float64 count differs by one at some steps from ~900 masks on).
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
    revealing falls to the tie rule (below).
  - ``logits``: the model's own ``softmax(logits)``, untempered and unfiltered. LLaDA's and
    Fast-dLLM's references rank by it, so the default for ``low_confidence``, ``random`` and
    ``confidence_threshold``; an option for Dream's rules whose ranks should not depend on T.
  At temperature 0 without top-p / top-k both are the same distribution.

Tie rule: in the default ``batched`` draw order, positions of equal confidence are revealed leftmost first
(a stable descending sort; ``confidence_threshold``'s fallback takes the first maximum), so fully saturated
confidences reveal left to right, like autoregressive decoding, on every device. The ``official`` order
chooses as the official loops do: ``torch.topk`` on a row of the whole sequence (prompt + response) with
``-inf`` off the candidates, in the references' dtype (Dream: one call over the ``[B, L_p + L_d]`` rows;
LLaDA, Fast-dLLM: one per row), so ties go where theirs go on the same device (in general not leftmost:
``torch.topk`` leaves the order of ties unspecified, and CPU and CUDA may order them differently). Ties are
common: where top-p leaves one token per position (often, at Dream's demo settings T = 0.2, ``top_p=0.95``)
every confidence is equal.

The mask token is never a choice: its logit is set to ``-inf`` before anything else, so every
distribution above is over the real tokens only and a revealed position never holds the mask id
(the references let the model pick it; they write it back and the position stays masked).

One step for the whole batch (:func:`unmask_batch`): every tensor is ``[B, L]`` (rows x the block's
positions), non-candidate positions are carried along and masked out, and the per-row reveal counts
are device tensors, so a step has fixed shapes, no Python loop over rows and no host-device
synchronisation. A position is chosen by its rank among its row's candidates (a stable sort of the
masked confidences, then ``rank < k``). Greedy decoding (temperature 0, no ``alg_temp``) chooses
exactly what the per-row formulation chooses (tested against it, ``tests/unmasking_reference.py``).
That is the ``batched`` draw order; the ``official`` one chooses by ``torch.topk`` (the tie rule above).

Random draws, two orders (``UnmaskingConfig.draw_order``); same seed and shapes give the same output in both.

``batched`` (the default; one ``torch.Generator`` for the batch, fixed shapes, in this order within a step):
  1. tokens, when temperature > 0: one ``torch.rand`` of ``[B, L, V]`` (row-major: row, position,
     token); the token is ``argmax(p / -log u)`` (the exponential race, the same distribution as a
     categorical draw from ``p``; Gumbel-max in another form);
  2. positions: ``random``: one ``torch.rand`` ``[B, L]`` as the confidence; ``origin``: one
     ``torch.rand`` ``[B, L]``, position revealed when ``u < p``; Dream's rules with ``alg_temp``: one
     ``torch.rand`` ``[B, L]`` turned into Gumbel noise added to ``confidence / alg_temp``, top-k of
     that (Gumbel-top-k: sampling k positions without replacement from ``softmax(conf / alg_temp)``,
     Kool et al. 2019).
Draws are made for every position, candidates or not, so a row's draws depend on the batch shape
and sampled outputs differ from the same request decoded alone and from the official loops' draws (the
same distributions, other numbers: e.g. Dream ``origin`` draws a uniform per masked position only).

``official`` (opt-in): the official loops' draws, so that a seeded run gives the tokens of the official
loop run after ``torch.manual_seed(seed)`` on the same logits (tested token-equal against a re-statement of
those loops, ``tests/official_loops_reference.py``). Dream's rules (``Dream-org/Dream`` ``_sample``): the
masked positions gathered row by row; ``origin``: one ``torch.rand`` per masked position against ``1 - s/t``
of a float32 ``linspace``, then tokens for the revealed ones; tokens at temperature > 0: one
``torch.multinomial`` (what ``Categorical(probs).sample()`` runs) of the normalised probabilities (the
argmax, no draw, when ``Categorical``'s simplex check fails, as Dream's ``except`` does);
``alg_temp``: ``torch.multinomial`` without replacement of ``softmax(confidence / alg_temp)`` over each row
of prompt + response. LLaDA's rules and ``confidence_threshold`` (``ML-GSAI/LLaDA``, ``NVlabs/Fast-dLLM``
``generate``): tokens at temperature > 0 as ``argmax(exp(logits) / (-log u) ** T)`` with float64 uniforms
``u`` for every position of prompt + response (``[B, L_p + L_d, V]`` per step), then for ``random`` one
float32 ``torch.rand`` ``[B, L_p + L_d]``; LLaDA's loop runs every step of a block's budget. Positions: the
references' ``torch.topk`` (the tie rule above). The gathering reads the candidate count, and ``torch.topk``
the per-row counts (host reads each step). The arithmetic is the references' too: Dream's
sampling and confidence and LLaDA's confidence in the logits' dtype (bf16 for a bf16 model), Fast-dLLM's
confidence in float64 (Dream's count is float32 in both orders). The mask-token exclusion holds in both orders.
"""

from __future__ import annotations

import numbers
import operator
from dataclasses import dataclass
from typing import NamedTuple

import torch

DREAM_ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")
LLADA_ALGS = ("low_confidence", "random")
ALGS = DREAM_ALGS + LLADA_ALGS + ("confidence_threshold",)
CONFIDENCE_SOURCES = ("tempered", "logits")
DRAW_ORDERS = ("batched", "official")
# The accepted temperatures (``temperature``, ``alg_temp``) besides 0: T and 1/T both normal float32
# (bfloat16 has float32's exponent range), so that neither the division by T nor the scalar T itself
# overflows or flushes to 0 in the dtype the distributions are computed in.
TEMPERATURE_RANGE = (2.0**-126, 2.0**126)


def integer(name: str, value) -> int:
    """``value`` as a Python int: an int or a numpy integer; a bool or a float (even ``8.0``) is a TypeError
    naming ``name`` (a float count would be truncated or fail deep inside torch)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    return operator.index(value)


def real_number(name: str, value) -> float:
    """``value`` as a Python float: an int, float or numpy real; a bool, a string or a tensor is a TypeError
    naming ``name``; an integer too large for a float (``10**400``) a ValueError naming it. Range checks (NaN, inf)
    are the caller's. -0.0 becomes 0.0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    try:
        return float(value) + 0.0
    except OverflowError:
        raise ValueError(f"{name} must be a finite number, got {value!r} (too large for a float)") from None


def _in_temperature_range(t: float) -> bool:
    lo, hi = TEMPERATURE_RANGE
    return lo <= t <= hi  # (False for NaN)


def _range_text() -> str:
    lo, hi = TEMPERATURE_RANGE
    return f"[{lo:.3g}, {hi:.3g}]"


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
        draw_order: ``batched`` (the default: fixed-shape draws, no host read) or ``official`` (the
            official loops' draws, same seed -> same tokens; see the module docstring).

    Raises:
        TypeError: temperature, top_p, alg_temp, eps or threshold not a real number, top_k not an
            integer (a bool is neither; numpy scalars are accepted).
        ValueError: unknown alg, confidence source or draw order, temperature or alg_temp neither 0 nor in
            :data:`TEMPERATURE_RANGE` (about [1.2e-38, 8.5e37]: T and 1/T finite in float32; so NaN, inf
            and < 0 too), top_p outside (0, 1], top_k < 1, eps outside (0, 1), threshold outside (0, 1]
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
    draw_order: str = "batched"

    def __post_init__(self):
        if self.alg not in ALGS:
            raise ValueError(f"unknown unmasking alg {self.alg!r}; choose from {ALGS}")
        if self.draw_order not in DRAW_ORDERS:
            raise ValueError(f"draw_order must be one of {DRAW_ORDERS}, got {self.draw_order!r}")
        if self.confidence_from is None:
            object.__setattr__(self, "confidence_from", default_confidence_from(self.alg))
        if self.confidence_from not in CONFIDENCE_SOURCES:
            raise ValueError(f"confidence_from must be one of {CONFIDENCE_SOURCES}, got {self.confidence_from!r}")
        for name in ("temperature", "top_p", "alg_temp", "eps", "threshold"):
            value = getattr(self, name)
            if value is not None or name in ("temperature", "eps", "threshold"):  # these three have no "off"
                object.__setattr__(self, name, real_number(name, value))
        if self.top_k is not None:
            object.__setattr__(self, "top_k", integer("top_k", self.top_k))
        # written as "not (in range)" so that NaN, which fails every comparison, is refused too
        if not (self.temperature == 0 or _in_temperature_range(self.temperature)):
            raise ValueError(
                f"temperature must be a finite number >= 0, got {self.temperature}: "
                f"0 (greedy) or in {_range_text()} (T and 1/T finite in float32)"
            )
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.alg_temp is not None and not (self.alg_temp == 0 or _in_temperature_range(self.alg_temp)):
            raise ValueError(
                f"alg_temp must be a finite number >= 0 (0 or None: top-k positions), got {self.alg_temp}: "
                f"0 or in {_range_text()} (T and 1/T finite in float32)"
            )
        if not 0 < self.eps < 1:
            raise ValueError(f"eps must be in (0, 1), got {self.eps}")
        if not 0 < self.threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")

    @property
    def fixed_steps(self) -> bool:
        """False for ``confidence_threshold``, whose step count depends on the model."""
        return self.alg != "confidence_threshold"

    @property
    def draws(self) -> bool:
        """Whether a step draws random numbers (sampled tokens, ``origin``, ``random`` or ``alg_temp``)."""
        positions = self.alg in ("origin", "random") or bool(self.alg in DREAM_ALGS and self.alg_temp)
        return self.temperature > 0 or positions


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
    logits, filtered, probs = _distributions(logits, cfg, mask_id)
    if cfg.temperature > 0:  # exponential race: argmax p / E with E ~ Exp(1) is a draw from p
        x0 = (probs / _uniform(probs.shape, probs, generator).log_().neg_()).argmax(dim=-1)
    else:
        x0 = probs.argmax(dim=-1)
    invalid = probs.gather(-1, x0[..., None]).squeeze(-1).isnan()
    return x0, _ranking_probs(logits, filtered, probs, cfg), invalid


def _distributions(logits: torch.Tensor, cfg: UnmaskingConfig, mask_id, dtype=torch.float32, reference=False):
    """(the logits in ``dtype`` with the mask token at -inf, the tempered and filtered logits, their softmax).

    The tempered logits are ``(logits - max) / T``: every value <= 0 and the maximum 0, so no T of
    :data:`TEMPERATURE_RANGE` overflows them (``logits / T`` does for a small T: inf, then a NaN softmax)
    and a tiny T gives the limit, the argmax one-hot (equal maxima share the mass). ``reference=True``
    (the official draw order) computes ``logits / T`` in ``dtype`` as the official loops do, and only
    the rows where that overflows (a NaN distribution from logits that are not NaN) are taken from the
    shifted float32 computation instead (the official loops return garbage or raise there)."""
    src = logits
    logits = logits.to(dtype)
    if mask_id is not None:
        logits = logits.clone() if logits is src else logits
        logits[..., mask_id] = float("-inf")
    if not cfg.temperature > 0:
        filtered = _filter_logits(logits, cfg.top_p, cfg.top_k)
        return logits, filtered, torch.softmax(filtered, dim=-1)
    if reference:
        filtered = _filter_logits(logits / cfg.temperature, cfg.top_p, cfg.top_k)
        probs = torch.softmax(filtered, dim=-1)
        _, safe_filtered, safe_probs = _distributions(logits, cfg, None, torch.promote_types(dtype, torch.float32))
        swap = (probs.isnan().any(dim=-1) & ~safe_probs.isnan().any(dim=-1))[..., None]
        filtered = torch.where(swap, safe_filtered.to(dtype), filtered)
        return logits, filtered, torch.where(swap, safe_probs.to(dtype), probs)
    tempered = (logits - logits.amax(dim=-1, keepdim=True)) / cfg.temperature
    filtered = _filter_logits(tempered, cfg.top_p, cfg.top_k)
    return logits, filtered, torch.softmax(filtered, dim=-1)


def _ranking_probs(logits, filtered, probs, cfg: UnmaskingConfig) -> torch.Tensor:
    """The distribution confidences are read from (``cfg.confidence_from``)."""
    if cfg.confidence_from == "logits" and filtered is not logits:  # else probs is softmax(logits) already
        return torch.softmax(logits, dim=-1)
    return probs


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


def dream_timesteps(steps: int, eps: float, device=None) -> torch.Tensor:
    """Dream's schedule ``torch.linspace(1, eps, steps + 1)``: float32, made on ``device`` (Dream makes it on
    the model's device), as Dream's ``diffusion_generate`` does."""
    return torch.linspace(1, eps, steps + 1, device=device)


def dream_ratio(step: int, steps: int, eps: float, device=None) -> torch.Tensor:
    """Share of the masks Dream reveals at ``step`` of ``linspace(1, eps, steps+1)``: ``1 - t_{i+1}/t_i``
    (1 at the last step), a 0-dim float32 tensor on ``device`` as Dream computes it (:func:`dream_timesteps`);
    no host read."""
    if step >= steps - 1:
        return torch.ones((), device=device)
    t = dream_timesteps(steps, eps, device)
    return 1 - t[step + 1] / t[step]


def dream_count(n_masked: int, step: int, steps: int, eps: float) -> int:
    """Dream's reveal count at ``step`` of the linear schedule ``linspace(1, eps, steps+1)``, with Dream's
    arithmetic: ``int(n * (1 - s / t))`` where ``n`` (Dream's masks per row, ``mask_index.sum() / B``), ``s`` and
    ``t`` are float32 tensors (a float64 product differs from about 900 masks on); all of them at the last step.
    On the CPU; :func:`unmask_batch` computes the same on the logits' device."""
    if step >= steps - 1:
        return n_masked
    return int(torch.tensor(n_masked, dtype=torch.float32) * dream_ratio(step, steps, eps))


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
    seq_span: tuple[int, int] | None = None,
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
        seq_span: ``(start, length)``: the block's first position in the official loops' sequence
            (prompt + response) and that sequence's length; only read by ``draw_order="official"``,
            whose LLaDA / Fast-dLLM token draws, ``random`` / Dream ``alg_temp`` position draws and
            ``torch.topk`` rows cover the whole sequence (None: the block alone, ``(0, L)``).

    Returns:
        :class:`StepChoice`. Per row the rules of the module docstring: Dream's count
        ``int(n * ratio)`` of the row's n candidates (float32 on the device, Dream's arithmetic, as
        :func:`dream_count`), LLaDA's quota, capped at n; ``confidence_threshold`` every candidate
        with confidence >= tau plus the most confident one; ``origin`` each candidate with
        probability ``ratio``. No host-device synchronisation, no Python loop over rows (the ``batched``
        order; the ``official`` one reads counts on the host, see the module docstring).

    Raises:
        ValueError: a LLaDA rule without ``block_masks``.
    """
    if cfg.draw_order == "official":
        return _official_step(logits, candidates, cfg, step, steps, block_masks, mask_id, generator, seq_span)
    x0, probs, invalid = choose_tokens(logits, cfg, generator, mask_id=mask_id)
    invalid = invalid & candidates
    if cfg.alg == "origin":
        ratio = dream_ratio(step, steps, cfg.eps, probs.device)
        reveal = candidates & (_uniform(candidates.shape, probs, generator) < ratio)
        return StepChoice(x0, reveal, invalid)
    conf = confidence_of(cfg.alg, probs, x0, generator)
    return _pick(conf, candidates, cfg, step, steps, block_masks, x0, invalid, generator)


def _reveal_counts(candidates, cfg: UnmaskingConfig, step: int, steps: int, block_masks) -> torch.Tensor:
    """``[B]`` int64 reveal counts of the fixed-count rules (Dream's schedule, LLaDA's quotas), capped at n."""
    n = candidates.sum(dim=1)
    if cfg.alg in LLADA_ALGS:
        if block_masks is None:
            raise ValueError(f"{cfg.alg} needs block_masks (each row's masks at the block's start)")
        k = block_masks // steps + (step < block_masks % steps).long()
    elif step >= steps - 1:
        k = n
    else:  # Dream's int(n * (1 - s / t)), all float32 (dream_count), on the device: no host read
        k = (n.float() * dream_ratio(step, steps, cfg.eps, n.device)).long()  # truncated, as int() (n >= 0)
    return torch.minimum(k, n)


def _pick(conf, candidates, cfg: UnmaskingConfig, step, steps, block_masks, x0, invalid, generator, span=None):
    """Positions from confidences ``[B, L]``: ``confidence_threshold``'s rule, or the schedule's count by rank
    (Gumbel-top-k for Dream's ``alg_temp``: the batched order's position draw). ``span`` ``(start, total)``: the
    official order's LLaDA / Fast-dLLM selection, ``torch.topk`` per row of the whole sequence
    (:func:`_official_topk`); None: the batched order's, ties leftmost."""
    if cfg.alg == "confidence_threshold":
        if span is None:
            best = conf.masked_fill(~candidates, float("-inf")).argmax(dim=1, keepdim=True)  # first maximum
            pick = (conf >= cfg.threshold).scatter(1, best, True)
        else:  # Fast-dLLM: the first of each row's topk over all its masks, and every other one >= tau
            pick = (conf >= cfg.threshold) | _official_topk(conf, candidates, candidates.sum(dim=1), span, first=True)
        return StepChoice(x0, candidates & pick, invalid)
    k = _reveal_counts(candidates, cfg, step, steps, block_masks)
    if span is not None:  # LLaDA's rules (Dream's take _official_dream_step)
        return StepChoice(x0, _official_topk(conf, candidates, k, span), invalid)
    if cfg.alg in DREAM_ALGS and cfg.alg_temp:  # Gumbel-top-k on softmax(conf / alg_temp)
        gumbel = -_uniform(candidates.shape, conf, generator).log_().neg_().log_()
        key = conf / cfg.alg_temp + gumbel
        # Equal keys are ranked by confidence (then leftmost): they tie only where conf / alg_temp overflowed to
        # -inf (entropy's negative confidences under an alg_temp near 1e-38), whose limit is the confidence order.
        by_conf = torch.sort(conf.masked_fill(~candidates, float("-inf")), dim=1, descending=True, stable=True).indices
        picked = top_ranked(key.gather(1, by_conf), candidates.gather(1, by_conf), k)
        return StepChoice(x0, torch.zeros_like(candidates).scatter(1, by_conf, picked), invalid)
    return StepChoice(x0, top_ranked(conf, candidates, k), invalid)


def _official_topk(conf, candidates, k, span, *, rows_at_once=False, first=False) -> torch.Tensor:
    """The official loops' choice of the ``k[b]`` most confident candidates of each row, as a ``[B, L]`` mask.

    As the references call it: the confidences ``conf`` (in the references' dtype, as given) laid on a row of
    the whole sequence, ``span = (start, total)`` (prompt + response), ``-inf`` everywhere but the candidates,
    then ``torch.topk``: per row (``row[b]``, LLaDA's and Fast-dLLM's loop over rows) or, ``rows_at_once``, over
    the ``[B, total]`` rows with one count (Dream's; rows of other counts in other calls). So positions of equal
    confidence are chosen as the official code chooses them on the same device (``torch.topk`` leaves that
    order unspecified; in general not the leftmost). ``first``: only each row's first index (Fast-dLLM's
    most-confident position). Reads ``k`` on the host. A pick off the candidates (``torch.topk`` takes a
    ``-inf`` position when a candidate's confidence is ``-inf``; the official loops then write off the masks) is
    not revealed: the rest of the row's count (``first``: one) goes to the most confident other candidates,
    leftmost first."""
    b, n_pos = candidates.shape
    start, total = span
    row = torch.full((b, total), float("-inf"), dtype=conf.dtype, device=conf.device)
    row[:, start : start + n_pos] = conf.masked_fill(~candidates, float("-inf"))
    counts = k.tolist()
    chosen = torch.zeros(b, total, dtype=torch.bool, device=conf.device)
    if rows_at_once:
        for count in sorted(set(counts) - {0}):  # (Dream skips a count of 0)
            rows = torch.tensor([r for r, c in enumerate(counts) if c == count], device=conf.device)
            chosen[rows[:, None], torch.topk(row, count).indices[rows]] = True
    else:
        for r, count in enumerate(counts):
            index = torch.topk(row[r], count).indices
            chosen[r, index[:1] if first else index] = True
    reveal = chosen[:, start : start + n_pos] & candidates
    wanted = k.clamp(max=1) if first else k
    return reveal | top_ranked(conf, candidates & ~reveal, wanted - reveal.sum(dim=1))


def _official_step(logits, candidates, cfg: UnmaskingConfig, step, steps, block_masks, mask_id, generator, seq_span):
    """:func:`unmask_batch` with the official loops' random draws (``draw_order="official"``; the module
    docstring lists them). Gathers the candidates with boolean indexing and reads the counts: host reads each step."""
    b, n_pos, _ = logits.shape
    start, total = (0, n_pos) if seq_span is None else seq_span
    if cfg.alg in DREAM_ALGS:
        return _official_dream_step(logits, candidates, cfg, step, steps, mask_id, generator, start, total)
    # the references' arithmetic: LLaDA's softmax in the logits' dtype, Fast-dLLM's in float64
    dtype = torch.float64 if cfg.alg == "confidence_threshold" else logits.dtype
    lg, filtered, probs = _distributions(logits, cfg, mask_id, dtype, reference=True)
    invalid = candidates & probs.amax(dim=-1).isnan()
    if cfg.temperature > 0:  # LLaDA's add_gumbel_noise: float64 uniforms for every position of the sequence
        u = torch.rand((b, total, logits.shape[-1]), generator=generator, device=logits.device, dtype=torch.float64)
        u = u[:, start : start + n_pos]
        kept = lg.double().masked_fill(filtered == float("-inf"), float("-inf"))
        score = kept.exp() / (-torch.log(u)) ** cfg.temperature
        # 0 / 0 where the noise underflows (a large T) at a zero-weight token: never the argmax (a NaN would be)
        x0 = score.masked_fill(score.isnan(), float("-inf")).argmax(dim=-1)
    else:
        x0 = probs.argmax(dim=-1)
    if cfg.alg == "random":  # LLaDA: one float32 uniform per position of the sequence, after the tokens'
        conf = torch.rand((b, total), generator=generator, device=logits.device)[:, start : start + n_pos]
    else:
        conf = confidence_of(cfg.alg, _ranking_probs(lg, filtered, probs, cfg), x0)
    return _pick(conf, candidates, cfg, step, steps, block_masks, x0, invalid, generator, (start, total))


def _official_dream_step(logits, candidates, cfg: UnmaskingConfig, step, steps, mask_id, generator, start, total):
    """Dream's ``_sample`` draws: the masked positions flattened row by row, ``origin``'s uniform per masked
    position, then ``Categorical`` (``torch.multinomial``) tokens for the revealed (``origin``) or all masked
    positions; ``alg_temp``: ``torch.multinomial`` without replacement over each row of the sequence."""
    b, n_pos, _ = logits.shape
    idx = candidates.nonzero(as_tuple=True)  # row-major, as Dream's x[mask_index]
    sub = logits[idx]  # [N, V]
    tokens = torch.zeros(b, n_pos, dtype=torch.long, device=logits.device)
    if cfg.alg == "origin":
        # Dream's p_transfer: 1 - s/t of float32 linspace(1, eps, steps + 1) on the device, 1 at the last step
        ratio = dream_ratio(step, steps, cfg.eps, logits.device)
        move = torch.rand(sub.shape[0], generator=generator, device=logits.device) < ratio
        x0, _, bad = _official_tokens(sub[move], cfg, mask_id, generator)
        reveal = torch.zeros_like(candidates)
        reveal[idx[0][move], idx[1][move]] = True
        tokens[idx[0][move], idx[1][move]] = x0
        invalid = torch.zeros_like(candidates)
        invalid[idx[0][move], idx[1][move]] = bad
        return StepChoice(tokens, reveal, invalid)
    x0, ranking, bad = _official_tokens(sub, cfg, mask_id, generator)
    tokens[idx] = x0
    invalid = torch.zeros_like(candidates)
    invalid[idx] = bad
    # in the logits' dtype, as Dream's full_confidence
    conf = torch.full(candidates.shape, float("-inf"), dtype=logits.dtype, device=logits.device)
    conf[idx] = confidence_of(cfg.alg, ranking, x0).to(logits.dtype)
    k = _reveal_counts(candidates, cfg, step, steps, None)
    if not cfg.alg_temp:  # Dream: torch.topk over the [B, prompt + response] rows
        return StepChoice(tokens, _official_topk(conf, candidates, k, (start, total), rows_at_once=True), invalid)
    k_max = int(k.max())
    reveal = torch.zeros_like(candidates)
    if k_max > 0:  # Dream: softmax(confidence / alg_temp) over the whole row, -inf outside the masks
        row = torch.full((b, total), float("-inf"), dtype=logits.dtype, device=logits.device)
        row[:, start : start + n_pos] = conf.to(logits.dtype)
        weights = torch.softmax(row / cfg.alg_temp, dim=-1)
        # where conf / alg_temp overflows (a small alg_temp; NaN weights, which multinomial refuses): the
        # same softmax shifted by the row's maximum, in float32 (the limit: the most confident positions)
        # (a row without candidates, all -inf: uniform weights, whose draws are dropped below)
        row32 = row.float()
        shifted = ((row32 - row32.amax(dim=-1, keepdim=True)) / cfg.alg_temp).nan_to_num(0.0, neginf=float("-inf"))
        safe = torch.softmax(shifted, dim=-1)
        weights = torch.where(weights.isnan().any(dim=-1, keepdim=True), safe.to(weights.dtype), weights)
        chosen = torch.multinomial(weights, k_max, generator=generator) - start
        keep = torch.arange(k_max, device=logits.device)[None, :] < k[:, None]  # a row's first k draws
        # a draw off the candidates is possible only when a candidate's weight underflowed to 0: not revealed
        keep &= (chosen >= 0) & (chosen < n_pos) & candidates.gather(1, chosen.clamp(0, n_pos - 1))
        col = torch.where(keep, chosen, n_pos)  # the rest go to a spare column (no write conflicts)
        spare = torch.zeros(b, n_pos + 1, dtype=torch.bool, device=logits.device)
        reveal = spare.scatter_(1, col, True)[:, :n_pos]
        # Fewer than k revealed (draws of zero weight: the official loop writes them off the masks, and its
        # last step leaves masks behind): the rest by confidence, the limit of the underflowed weights.
        reveal |= top_ranked(conf, candidates & ~reveal, k - reveal.sum(dim=1))
    return StepChoice(tokens, reveal, invalid)


def _official_tokens(sub, cfg: UnmaskingConfig, mask_id, generator):
    """Dream's ``sample_tokens`` on ``sub`` ``[N, V]``: (tokens, ranking distribution, NaN flags). At temperature
    > 0 one ``Categorical(probs).sample()``, i.e. ``torch.multinomial`` of the normalised probs; when those fail
    ``Categorical``'s simplex check (some row's sum off 1 by 1e-6 or more, or a NaN), Dream's ``except`` takes
    the argmax of every row and draws nothing: so does this order."""
    lg, filtered, probs = _distributions(sub, cfg, mask_id, sub.dtype, reference=True)  # in the logits' dtype
    bad = probs.amax(dim=-1).isnan()
    x0 = None
    if cfg.temperature > 0 and sub.shape[0]:
        norm = probs / probs.sum(-1, keepdim=True)
        if bool(((norm >= 0).all(dim=-1) & ((norm.sum(-1) - 1).abs() < 1e-6)).all()):
            x0 = torch.multinomial(norm, 1, True, generator=generator).squeeze(-1)
    if x0 is None:
        x0 = probs.argmax(dim=-1)
    return x0, _ranking_probs(lg, filtered, probs, cfg), bad
