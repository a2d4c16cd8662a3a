"""``dllm.generate``: the public API of diffusion decoding.

It checks the arguments, builds one of three cache policies (:mod:`dllm.decode.policies`),
runs the denoising loop (:func:`dllm.decode.denoise.denoise`) and returns the tokens, text
and per-phase stats:

- ``dense`` (the transformers baseline): every step re-encodes prompt + response.
  Per step ``O((L_p + L_d)^2)`` attention.
- ``prefix_cache`` (Fast-dLLM v1 style prefix caching): at the start of every block
  the whole sequence is encoded once and the K/V of the prompt (all but its last
  ``live_window`` tokens) are kept; each step recomputes only the live block (the
  last prompt tokens + the response) against that cache.
- ``prefilling`` (Prefilling-dLLM, arXiv 2606.10537): see :mod:`dllm.prefilling`;
  the context may come pre-encoded as a :class:`dllm.DocumentCache`.

Greedy decoding (temperature 0) is deterministic; sampling rules draw from a
``torch.Generator`` seeded by ``seed``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch

from dllm.decode.block_cache import check_block_cache
from dllm.decode.denoise import denoise
from dllm.decode.policies import CACHE_SCOPES, REFRESH_MODES, DensePolicy, PrefixCachePolicy
from dllm.decode.step_graph import cuda_graph_support
from dllm.decode.timer import PhaseTimer
from dllm.decode.unmasking import UnmaskingConfig, integer
from dllm.model.devices import check_ids_for_model
from dllm.model.tokenization import decode_text
from dllm.prefilling.pipeline import build_prefilling_policy
from dllm.prefilling.reselect import Reselector, check_reselect

METHODS = ("dense", "prefix_cache", "prefilling")


@dataclass
class GenerationStats:
    """What a generation cost.

    Attributes:
        nfe: model forwards (network function evaluations), cache builds included.
        steps: denoising steps run.
        seconds: wall-clock seconds per phase: ``prefill`` (building static caches; with a
            document only the prefix), ``scoring`` (prefilling only: draft, chunk scores,
            selection and the static cache), ``decode`` (the denoising steps), ``total``.
        extra: method-specific details (prefilling: chunk ids, scores...; for a batch of prompts
            ``batch_size``, the rows' details being in ``rows``).
        rows: prefilling only: one dict per batch row, that row's details (what ``extra`` holds for
            a single prompt: ``selected_chunks``, scores, ``cached_tokens``...) plus ``steps``, the
            denoising steps in which the row still had masks (its own run's ``steps``). ``nfe``,
            ``steps`` and ``seconds`` above are the whole batch's: its rows share every forward.
    """

    nfe: int = 0
    steps: int = 0
    seconds: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    rows: list = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        total = self.seconds.get("total", 0.0)
        return self.extra.get("gen_tokens", 0) / total if total > 0 else float("nan")


@dataclass
class GenerationResult:
    """Output of :func:`generate`.

    Attributes:
        tokens: ``[B, gen_length]`` int64 response tokens (mask-free); ``tokens[i]`` is row i's (for a
            list of prompts, prompt i's).
        stats: :class:`GenerationStats` (per-row details in ``stats.rows``).
        text: decoded responses cut at EOS, ``text[i]`` for row i (None when the model has no tokenizer).
    """

    tokens: torch.Tensor
    stats: GenerationStats
    text: list | None = None


def default_alg(model) -> str:
    """Dream -> ``maskgit_plus``; LLaDA -> ``low_confidence`` (each project's greedy default)."""
    return "low_confidence" if model.family == "llada" else "maskgit_plus"


class PositionWindowWarning(UserWarning):
    """A generation reaches RoPE positions past the model's trained window (``config.trained_positions``): the
    answer is decoded out of distribution. The CLI checks the same before decoding and notes it itself."""


def warn_past_window(model, live) -> None:
    """An :class:`PositionWindowWarning` when a row of the live block (``live``: the policy's
    :class:`~dllm.decode.policies.LiveBlock`) reaches a position past the model's trained positions (one host read
    of the positions, before the loop)."""
    limit = getattr(model.config, "trained_positions", None)  # (a stand-in model's config may have none)
    if not limit or live is None:
        return
    real = torch.tensor([h + live.resp_cols.shape[1] for h in live.head_lens], device=live.positions.device)
    end = int(live.positions.gather(1, (real - 1)[:, None]).max()) + 1  # positions reached, the last one's + 1
    if end > limit:
        warnings.warn(
            f"the prompt (or prefix, kept chunks and query) and gen_length {live.resp_cols.shape[1]} reach position "
            f"{end}, past the model's {limit} trained positions: the answer is decoded out of distribution "
            "(lower gen_length, top_k or chunk_size)",
            PositionWindowWarning,
            stacklevel=4,  # warn_past_window <- generate <- torch.no_grad's wrapper <- the caller
        )


SEED_LIMIT = 2**64  # torch.Generator.manual_seed takes 64 bits


def _count(name: str, value) -> int:
    """A count argument (``gen_length``, ``steps``...) as a Python int >= 1: an int or numpy integer; a bool or
    float is a TypeError (``steps=2.7`` would run 2 steps), a value < 1 a ValueError; both name the argument."""
    value = integer(name, value)
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def _seed(value) -> int:
    """A seed: an int (or numpy integer) in ``[0, 2**64)``, the range of ``torch.Generator.manual_seed``; a
    negative one is refused (to many tools -1 means "unseeded": leave ``seed`` None for that)."""
    value = integer("seed", value)
    if not 0 <= value < SEED_LIMIT:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {value} (seed=None: unseeded)")
    return value


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
    check_ids_for_model(model, input_ids, "input_ids are", "the prompt contains", "prompt")
    return input_ids.long()


def _response_start(policy) -> int:
    """The response's first position in the sequence (its RoPE position: the prompt length for ``dense`` and
    ``prefix_cache``), where the official loops' whole-sequence draws put it.

    Raises:
        ValueError: rows whose responses start at different positions (the official loops decode rows of
            one prompt length).
    """
    live = getattr(policy, "live", None)
    if live is None:
        return 0
    starts = live.positions.gather(1, live.resp_cols[:, :1]).flatten().tolist()
    if len(set(starts)) > 1:
        raise ValueError(
            f"draw_order='official' needs rows whose responses start at one position (got {sorted(set(starts))}): "
            "the official loops decode prompts of one length"
        )
    return starts[0]


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
    draw_order: str = "batched",
    seed: int | None = None,
    live_window: int = 1,
    cache_refresh: str = "block",
    cache_scope: str = "sequence",
    block_cache=None,
    reselect: int | None = None,
    prompt=None,
    prefilling=None,
    document=None,
    cuda_graph: bool | None = None,
    progress: bool = False,
) -> GenerationResult:
    """Generate a response with a diffusion LM.

    Args:
        model: a :class:`~dllm.model.modeling.DiffusionLM` (e.g. from :func:`dllm.load_model`).
        input_ids: prompt ``[B, L_p]`` or ``[L_p]`` int64 on the model's device (for
            ``prefilling`` pass ``prompt`` instead, or the whole prompt as one context).
        method: ``"dense"``, ``"prefix_cache"`` or ``"prefilling"``.
        gen_length: response tokens L_d.
        steps: denoising steps in total (default gen_length: one token per step);
            split evenly over the blocks.
        block_length: semi-autoregressive block size (default gen_length = one block).
        alg: unmasking rule (see :mod:`dllm.decode.unmasking`); default by family.
        temperature, top_p, top_k, alg_temp, eps, threshold: rule parameters. ``top_k`` None
            filters nothing, as Dream's ``generation_config.json`` says; the official
            ``diffusion_generate`` under transformers 4.46 inherits ``top_k=50`` from the model
            config instead: pass ``top_k=50`` (and ``draw_order="official"``) to reproduce its outputs.
        confidence_from: ``"tempered"`` (rank positions by the tempered, filtered distribution the
            tokens are drawn from: Dream's reference) or ``"logits"`` (by ``softmax(logits)``: LLaDA's
            and Fast-dLLM's); None = the rule's reference (see :mod:`dllm.decode.unmasking`).
        draw_order: the random draws of sampling rules (temperature > 0, ``origin``, ``random``,
            ``alg_temp``). ``"batched"`` (default): fixed-shape draws for the whole batch, no host-device
            synchronisation; same seed -> same output, but other draws than the official loops (the same
            distribution). ``"official"``: the draws of the official Dream / LLaDA / Fast-dLLM loops run
            after ``torch.manual_seed(seed)`` on the same device: same seed and logits -> the same tokens
            as those loops (dense decoding over prompt + response, rows of one prompt length), tied
            confidences chosen by ``torch.topk`` as theirs are; a few host reads per step, and LLaDA's sampled
            tokens draw ``[B, L_p + L_d, V]`` float64 uniforms per step, as the official loop does (see
            :mod:`dllm.decode.unmasking`).
        seed: seeds the sampling RNG (same seed -> same output).
        live_window, cache_refresh, cache_scope: ``prefix_cache`` options (see
            :class:`dllm.decode.policies.PrefixCachePolicy`).
        block_cache: every method: how a denoising step treats the live tokens outside the current block
            (:mod:`dllm.decode.block_cache`). ``"block"``: their K/V are cached at each block's first step
            and a step recomputes the current block only (Fast-dLLM's DualCache, beside the static cache):
            a step's cost no longer grows with the answer. An int N: refreshed also every N steps.
            ``"step"``: refreshed every step (exact, for testing). ``"off"``: every step recomputes them
            all (the exact path). None (default): ``"block"`` when ``gen_length > block_length``, else
            ``"off"``; ``"off"`` with ``draw_order="official"`` (the official loops recompute every step).
            ``stats.extra`` gets ``block_cache`` (the mode), ``block_cache_refreshes`` and ``block_cache_bytes``.
        reselect: ``prefilling`` only: re-score the chunks at every N-th block start against the query plus the
            answer so far and keep the new top-K (:mod:`dllm.prefilling.reselect`; no chunk re-encoded; independent
            cache mode; the answer must have several blocks). None or 0 (default): the question's selection serves
            the whole answer. The steps then run eagerly (no CUDA graph: the static cache changes). ``stats.extra``
            (a batch: each row's) gets ``reselections`` and ``reselected_chunks`` (``[response position, kept
            chunks]`` per re-selection).
        prompt: ``prefilling`` only: a :class:`dllm.prefilling.PromptParts` (prefix,
            context, query token ids), or a list of them: a batch of requests (any context, query
            and chunk counts) decoded in one denoising loop over live blocks padded to the longest
            row; row i's tokens equal those of prompt i alone (greedy decoding; sampling rules draw
            from one generator for all rows, so their draws differ from single runs).
        prefilling: ``prefilling`` only: a :class:`dllm.prefilling.PrefillingConfig` (default:
            the defaults; with a document, the document's chunk size).
        document: ``prefilling`` only: a :class:`dllm.DocumentCache` of the context (from
            :func:`dllm.encode_document`); pass ``prompt=PromptParts(prefix, None, query)``. No
            chunk is re-encoded; the tokens equal a fresh run on the same context and config. With
            a list of prompts: one document for every row, or a list of one document (or None,
            for a row that brings its context) per row.
        cuda_graph: ``prefilling`` only: capture each denoising step's forward in a CUDA graph
            and replay it (:mod:`dllm.decode.step_graph`; same tokens, less host overhead, the gain on a
            GPU predicted). None = on where supported (CUDA, compiled Triton kernels), a failed
            capture then warns and runs the steps eagerly; True where unsupported raises; False = eager
            steps. When a graph was asked for, ``stats.extra["cuda_graph"]`` says ``"replayed"`` or why not.
        progress: tqdm progress bars.

    Returns:
        :class:`GenerationResult` (tokens ``[B, gen_length]``, stats, decoded text).

    Raises:
        TypeError: ``gen_length``, ``steps``, ``block_length``, ``live_window``, ``top_k`` or ``seed`` not an
            integer (ints and numpy integers are accepted; a bool or a float such as ``8.0`` is refused),
            ``block_cache`` neither None, a string nor an integer,
            ``cuda_graph`` not None or a bool, ``progress`` not a bool,
            ``temperature``, ``top_p``, ``alg_temp``, ``eps`` or ``threshold`` not a real number; a prompt
            list or document of the wrong type. Every argument is checked before any work.
        ValueError: unknown method/alg/confidence_from/draw_order/cache_refresh/cache_scope/block_cache (checked
            for every method), a block_cache interval < 1, a count < 1, ``gen_length % block_length != 0``,
            temperature or alg_temp neither 0 nor in about [1.2e-38, 8.5e37] (T and 1/T finite in float32;
            a tiny T decodes the greedy limit, no overflow), top_p outside (0, 1], a seed outside [0, 2**64),
            steps not divisible by the number of blocks, ``reselect`` with a one-block answer, a prompt containing
            the mask id,
            prompt on another device than the model, options of another method; with a
            document: a context too, or a chunk size, model, dtype or anchor other than the
            document's; ``cuda_graph=True`` where CUDA graphs are not supported (the message says why);
            NaN logits at a position being decoded (the message names the denoising step, row and
            position; a NaN never becomes a token). The mask token is never returned: its logit is
            excluded before tokens are chosen (:mod:`dllm.decode.unmasking`).
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {METHODS}")
    gen_length = _count("gen_length", gen_length)
    block_length = gen_length if block_length is None else _count("block_length", block_length)
    if gen_length % block_length:
        raise ValueError(f"gen_length ({gen_length}) must be a positive multiple of block_length ({block_length})")
    steps = gen_length if steps is None else _count("steps", steps)
    live_window = _count("live_window", live_window)
    # checked for every method (dense and prefilling ignore them, but a typo must not pass unseen)
    for name, value, allowed in (
        ("cache_refresh", cache_refresh, REFRESH_MODES),
        ("cache_scope", cache_scope, CACHE_SCOPES),
    ):
        if not isinstance(value, str) or value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    reselect = check_reselect(reselect, method)
    if block_cache is None and draw_order == "official":  # the official Dream / LLaDA loops recompute every step
        block_cache = "off"
    block_cache = check_block_cache(block_cache, gen_length, block_length)
    seed = None if seed is None else _seed(seed)
    for name, flag, allowed in (("cuda_graph", cuda_graph, (bool, type(None))), ("progress", progress, (bool,))):
        if not isinstance(flag, allowed):
            raise TypeError(f"{name} must be {' or '.join(t.__name__ for t in allowed)}, got {flag!r}")
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
        draw_order=draw_order,
    )
    if reselect and n_blocks == 1:  # it re-selects at block starts after the first: one block has none
        raise ValueError(
            f"reselect={reselect} needs an answer of several blocks (gen_length {gen_length} is one block of "
            f"{block_length}): pass a block_length that divides it, e.g. 32"
        )
    if cfg.fixed_steps and steps % n_blocks:
        raise ValueError(f"steps ({steps}) must be a multiple of the number of blocks ({n_blocks})")
    if method != "prefilling" and (
        prompt is not None or prefilling is not None or document is not None or cuda_graph is not None
    ):
        raise ValueError("prompt=, prefilling=, document= and cuda_graph= are options of method='prefilling'")
    if method != "prefix_cache":  # set away from their defaults they would be ignored: say so instead
        changed = [
            f"{name}={value!r}"
            for name, value, default in (
                ("live_window", live_window, 1),
                ("cache_refresh", cache_refresh, "block"),
                ("cache_scope", cache_scope, "sequence"),
            )
            if value != default
        ]
        if changed:
            raise ValueError(f"{', '.join(changed)}: options of method='prefix_cache', not of method={method!r}")
    use_graph = False
    if method == "prefilling":
        supported, why = cuda_graph_support(model.device)
        if cuda_graph and not supported:
            raise ValueError(f"cuda_graph=True is not supported here: {why}")
        if cuda_graph and reselect:
            raise ValueError("cuda_graph=True cannot replay steps whose static cache changes: drop reselect= or it")
        supported = supported and not reselect
        # default: on where supported, falling back to eager steps (with a warning) if the capture fails
        use_graph = ("auto" if supported else False) if cuda_graph is None else bool(cuda_graph)
    generator = None
    if seed is not None:
        generator = torch.Generator(device=model.device).manual_seed(seed)

    timer = PhaseTimer(model.device)
    extra, row_extra = {}, None
    with timer.phase("total"):
        if method == "prefilling":
            setup = build_prefilling_policy(
                model,
                input_ids,
                prompt,
                prefilling,
                timer,
                gen_length=gen_length,
                document=document,
                progress=progress,
                cuda_graph=use_graph,
            )
            policy, extra = setup.policy, setup.stats()
            row_extra = setup.row_stats()
            if reselect:
                check_reselect(reselect, method, setup.cfg)
                policy.reselector = Reselector(model, setup.rows, setup.cfg, reselect, gen_length, timer)
        else:
            input_ids = check_prompt(model, input_ids)
            if method == "dense":
                policy = DensePolicy(model, input_ids, gen_length)
            else:
                policy = PrefixCachePolicy(
                    model,
                    input_ids,
                    gen_length,
                    timer,
                    live_window=live_window,
                    refresh=cache_refresh,
                    scope=cache_scope,
                )
        policy.use_block_cache(block_length, block_cache)
        warn_past_window(model, getattr(policy, "live", None))
        batch = policy.batch_size
        resp = torch.full((batch, gen_length), model.mask_token_id, dtype=torch.long, device=model.device)
        row_steps = []
        seq_start = _response_start(policy) if cfg.draw_order == "official" else 0
        n_steps = denoise(
            policy,
            resp,
            mask_id=model.mask_token_id,
            block_length=block_length,
            steps_per_block=steps // n_blocks if cfg.fixed_steps else block_length,
            cfg=cfg,
            timer=timer,
            generator=generator,
            progress=progress,
            row_steps=row_steps,
            seq_start=seq_start,
        )
    stats = GenerationStats(nfe=policy.nfe, steps=n_steps, seconds=timer.seconds, extra=extra)
    stats.extra["gen_tokens"] = batch * gen_length
    stats.extra["block_cache"] = block_cache
    if policy.block_cache is not None:
        stats.extra["block_cache_refreshes"] = policy.block_cache.refreshes
        stats.extra["block_cache_bytes"] = policy.block_cache.nbytes()
    rs = getattr(policy, "reselector", None)
    if rs is not None:  # per row: what was kept at each re-selection
        for r, history in zip(row_extra, rs.history):
            r.update(reselections=len(history), reselected_chunks=history)
        if row_extra and "batch_size" not in stats.extra:
            stats.extra.update(reselections=rs.count, reselected_chunks=rs.history[0])
    if row_extra is not None:
        stats.rows = [{**r, "steps": n, "gen_tokens": gen_length} for r, n in zip(row_extra, row_steps)]
    if getattr(policy, "graph", None) is not None:  # a CUDA graph was asked for: say whether it replayed
        stats.extra["cuda_graph"] = "replayed" if policy.graph.replaying else f"eager ({policy.graph.failed})"
    return GenerationResult(resp, stats, decode_text(model, resp))
