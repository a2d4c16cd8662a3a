"""What the model layer borrows from transformers beyond its tokenizers: a quiet way to call it.

Dream and LLaDA ship remote-code configs that transformers only half knows; :mod:`dllm.model.rope` builds a
transformers config only to reuse its RoPE initialisers, and :mod:`dllm.model.loader` loads tokenizers, and
neither wants transformers' warnings about foreign model types on the user's terminal.
"""

from __future__ import annotations

import contextlib
import warnings


@contextlib.contextmanager
def quiet_transformers():
    """Silence transformers' warnings about foreign model types and deprecated fields (Dream and
    LLaDA ship remote-code configs that transformers only half knows; we read their fields ourselves)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)
