"""The shares of a curriculum phase's mix as drawn, for the tests that compare them with the shares a phase states,
and the checks every trial phase shares (run alone from given weights, its own peak and step count)."""

import math
import random
from collections import Counter

from bench.tiny import train
from bench.tiny.curriculum import PHASES, draw_sample


def drawn_shares(phase, total: int, n: int = 400, seed: int = 5) -> Counter:
    """The share of each ``(mode, kind)`` over ``n`` samples of ``phase`` at about ``total`` tokens, drawn from
    ``random.Random(seed)`` (0 for a pair never drawn). Over 400 draws three standard deviations of a share are
    at most 0.075."""
    rng = random.Random(seed)
    counts = Counter()
    for _ in range(n):
        s, mode = draw_sample(rng, None, total, phase)
        counts[(mode, s.kind)] += 1
    return Counter({key: c / n for key, c in counts.items()})


def assert_shares(phase, total: int, stated: dict, n: int = 400) -> None:
    """Each ``(mode, kind)`` of ``stated`` drawn (:func:`drawn_shares`) within three standard deviations of a
    binomial share over ``n`` draws (plus 0.005 of slack) of the share the phase states, and drawn at least once."""
    shares = drawn_shares(phase, total, n)
    for key, p in stated.items():
        assert shares[key] > 0, (key, "never drawn")  # a small stated share would pass within its tolerance
        assert abs(shares[key] - p) < 3 * math.sqrt(p * (1 - p) / n) + 0.005, (key, shares[key], p)


def assert_trial_phase(number: int, steps: int, peak: float):
    """Phase ``number`` is a trial that follows the phase before it, runs ``steps`` steps with its own warm-up and
    cosine from ``peak`` (``--lr<number>``'s default), runs alone with ``--phase <number> --init``, and the
    training docstring says so. Returns the phase."""
    ph = PHASES[number - 1]
    assert ph.trial and ph.lr == (peak, 50) and ph.first == PHASES[number - 2].end and ph.end - ph.first == steps
    args = train.parse_args(["--phase", str(number), "--init", "dllm/assets/tiny-dream", "--no-bf16"])
    assert args.phase == number and getattr(args, f"lr{number}") == peak and not args.bf16
    assert f"phase {number} (steps {ph.first}-{ph.end}, own warm-up and cosine from lr {peak}" in train.__doc__
    return ph
