"""Device helpers, and the check that token ids can go into a model (its device, mask id, vocabulary)."""

from __future__ import annotations

import torch


def same_device(a: torch.device, b: torch.device) -> bool:
    """Device equality that treats ``cuda`` and ``cuda:<current>`` as the same device."""
    a, b = torch.device(a), torch.device(b)
    if a.type != b.type:
        return False
    if a.type == "cuda" and (a.index is None or b.index is None):
        cur = torch.cuda.current_device()
        return (a.index if a.index is not None else cur) == (b.index if b.index is not None else cur)
    return a.index == b.index


def check_ids_for_model(model, ids: torch.Tensor, on: str, contains: str, ids_of: str) -> None:
    """Token ids ``ids`` (any shape, integer) lie on the model's device, hold no mask token and are in its vocabulary.

    Empty ``ids`` pass. The three subjects start each message as the callers have always worded it:
    ``f"{on} on <device> ..."`` (e.g. ``"input_ids are"``), ``f"{contains} the mask token id ..."``
    (``"the prompt contains"``), ``f"{ids_of} token ids must be in [0, V)"`` (``"prompt"``).

    Raises:
        ValueError: another device than ``model.device``, the mask token id, an id outside ``[0, vocab_size)``.
    """
    if ids.numel() and not same_device(ids.device, model.device):
        raise ValueError(f"{on} on {ids.device} but the model is on {model.device}")
    if (ids == model.mask_token_id).any():
        raise ValueError(f"{contains} the mask token id {model.mask_token_id}")
    if ids.numel() and (ids.min() < 0 or ids.max() >= model.config.vocab_size):
        raise ValueError(f"{ids_of} token ids must be in [0, {model.config.vocab_size})")
