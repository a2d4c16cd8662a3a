"""Log-likelihood of a continuation under a masked diffusion LM, by Monte Carlo over masks.

A masked diffusion LM has no left-to-right factorisation to read ``log p(x | c)`` from; LLaDA (Nie et
al. 2025, "Large Language Diffusion Models", arXiv 2502.09992; its ``get_log_likelihood.py``) and Dream
7B (Ye et al. 2025; its lm-eval model, with t ~ U(0, 1) and a coin per token) score multiple-choice
answers by the ELBO

    log p(x | c)  >=  E_t E_{x_t} [ (1/t) * sum_{i masked in x_t} log p_theta(x_i | c, x_t) ]

where the continuation x (L tokens) is noised to x_t by masking its tokens at rate t, the context c
is never masked, and the model predicts every masked token in one forward. Our sampler (code our
own): t = l / L with the masked count l in {1..L}; for n samples, l cycles through 1..L from a random
start (stratified: every l occurs n/L times when L divides n), each sample masks a uniformly random
l-subset of the continuation, and weights its masked tokens' log-probabilities by 1/t = L / l: for each
l an unbiased estimate of the ELBO (a token is in the subset with probability l / L). For a model whose
prediction of each token ignores the other continuation tokens, the ELBO is the exact
``sum_i log p(x_i | c)``; with every token masked (l = L) one sample is the one-forward score.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dllm.model.devices import same_device


@torch.no_grad()
def masked_diffusion_loglikelihood(
    model,
    context_ids: torch.Tensor,
    continuation_ids: torch.Tensor,
    *,
    samples: int = 128,
    batch_size: int = 32,
    generator: torch.Generator | None = None,
) -> float:
    """Monte Carlo ELBO estimate of ``log p(continuation | context)`` (see the module docstring).

    Args:
        model: a :class:`dllm.DiffusionLM` (its ``forward`` maps token i's logits to column i,
            Dream's shift included).
        context_ids: ``[P]`` int64 token ids (BOS first if wanted; may be empty), never masked.
        continuation_ids: ``[L]`` int64 token ids, ``L >= 1``.
        samples: n, masked copies of the sequence averaged.
        batch_size: copies per forward.
        generator: a ``torch.Generator`` on the model's device for the start of the l cycle and the
            subsets (None: torch's global RNG).

    Returns:
        The estimate in nats, summed over the continuation's tokens (<= 0).

    Raises:
        ValueError: empty continuation, ids that are not 1-D int64 on the model's device, the mask
            token among them, ids outside the vocabulary, ``samples`` or ``batch_size`` < 1.
    """
    for name, ids in (("context_ids", context_ids), ("continuation_ids", continuation_ids)):
        if not torch.is_tensor(ids) or ids.dim() != 1 or ids.dtype != torch.long:
            raise ValueError(f"{name} must be a 1-D int64 tensor")
        if not same_device(ids.device, model.device):
            raise ValueError(f"{name} is on {ids.device}, the model on {model.device}")
        if ids.numel() and (bool((ids == model.mask_token_id).any()) or ids.min() < 0):
            raise ValueError(f"{name} holds the mask token {model.mask_token_id} or a negative id")
        if ids.numel() and ids.max() >= model.config.vocab_size:
            raise ValueError(f"{name} holds ids outside the vocabulary [0, {model.config.vocab_size})")
    if continuation_ids.numel() == 0:
        raise ValueError("the continuation is empty: nothing to score")
    if samples < 1 or batch_size < 1:
        raise ValueError(f"samples and batch_size must be >= 1, got {samples} and {batch_size}")
    dev = model.device
    p, n = context_ids.numel(), continuation_ids.numel()
    seq = torch.cat([context_ids, continuation_ids])
    positions = torch.arange(p + n, device=dev)
    target = continuation_ids
    start = int(torch.randint(0, n, (), generator=generator, device=dev))
    total = 0.0
    for first in range(0, samples, batch_size):
        rows = torch.arange(first, min(first + batch_size, samples), device=dev)
        b = rows.numel()
        counts = (start + rows) % n + 1  # l per copy, cycling through 1..L
        # a uniformly random l-subset: the l smallest of L i.i.d. uniforms
        rank = torch.rand(b, n, generator=generator, device=dev).argsort(dim=1).argsort(dim=1)
        masked = rank < counts[:, None]  # [b, L] bool, exactly l True per row
        x = seq.expand(b, -1).clone()
        x[:, p:] = torch.where(masked, model.mask_token_id, target.expand(b, -1))
        cols = (p + torch.arange(n, device=dev)).expand(b, -1)
        logits = model(x, positions, logits_at=cols).logits.float()  # [b, L, V]
        logp = F.log_softmax(logits, dim=-1).gather(-1, target.expand(b, -1)[..., None])[..., 0]  # [b, L]
        total += float(((logp * masked).sum(1) * (n / counts.float())).sum())
    return total / samples
