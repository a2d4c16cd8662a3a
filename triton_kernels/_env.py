"""The package's environment variables, read on every call and cheaply.

Each ``PREFILLING_DLLM_*`` switch is read when it is used (not at import), so setting one at run
time takes effect, and an unknown word is an error rather than the default.
"""

from __future__ import annotations

import os

# os.environ's bytes mapping on POSIX (what os.environ.get reads through str encode/decode, ~1 us a
# call): the same values, read in ~50 ns. Elsewhere os.environ.get itself.
_ENV_BYTES = os.environ._data if os.name == "posix" and type(getattr(os.environ, "_data", None)) is dict else None
_ENV_SEEN: dict = {}  # (name, raw value) -> decoded value
_ENV_KEYS = {
    n: os.fsencode(n)
    for n in ("PREFILLING_DLLM_BACKEND", "PREFILLING_DLLM_CHECK_VALUES", "PREFILLING_DLLM_DIRECT_LAUNCH")
}

ON_WORDS = ("1", "true", "yes")
OFF_WORDS = ("0", "false", "no")


def env(name: str, default: str) -> str:
    """``os.environ.get(name, default)``, cheaper on POSIX (no encode/decode on a repeated value).

    Under ``torch.compile`` it is read once, when the caller is traced, and the graph keeps that value (as
    dynamo does for ``os.environ.get``): setting a variable later takes effect after ``torch._dynamo.reset()``.
    """
    if _ENV_BYTES is None:
        return os.environ.get(name, default)
    raw = _ENV_BYTES.get(name.encode() if name not in _ENV_KEYS else _ENV_KEYS[name])
    if raw is None:
        return default
    value = _ENV_SEEN.get((name, raw))
    if value is None:
        value = _ENV_SEEN[(name, raw)] = os.fsdecode(raw)
    return value


# What torch.compiler.assume_constant_result(env) sets, without importing dynamo at import time (1 s): dynamo
# then calls env while tracing instead of tracing into it. Traced, the read of os.environ's own dict guarded
# every compiled op on the environment's size: any variable set anywhere recompiled it, and fullgraph failed
# after 8 (recompile_limit).
env._dynamo_marked_constant = True  # type: ignore[attr-defined]


def env_switch(name: str, default: bool) -> bool:
    """An on/off variable: ``1/true/yes`` or ``0/false/no`` (any case), unset or empty: ``default``.

    Raises:
        ValueError: any other word (``on``, ``2``, a typo), naming the variable.
    """
    value = env(name, "")
    if value == "":
        return default
    word = value.strip().lower()
    if word in ON_WORDS:
        return True
    if word in OFF_WORDS:
        return False
    if word == "":
        return default
    raise ValueError(f"{name} must be 1/true/yes or 0/false/no, got {value!r}")
