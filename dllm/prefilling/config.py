"""``PrefillingConfig``: the knobs of Prefilling-dLLM (arXiv 2606.10537), with the reference code's defaults.

A checkpoint directory may carry its own tuned defaults in ``prefilling_config.json``
(:meth:`PrefillingConfig.from_pretrained`); explicit arguments override them. The chunk
anchor id is chosen by :func:`resolve_anchor_token_id`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
from dataclasses import asdict, dataclass, fields

from dllm.model.json_files import read_json

POSITION_MODES = ("reuse", "continuous", "absolute")
CACHE_MODES = ("independent", "joint")
SCORE_MODES = ("dllm", "causal")
SCORE_TERMS = ("self_info", "pseudo_label", "answer_confidence", "draft_contrast")
DEFAULT_TERMS = ("self_info", "pseudo_label")
# The lexical weight's ceiling: the fused score adds weight x a z-score (|z| <= sqrt(N)); past ~1e38 / sqrt(N) that
# overflows fp32 to inf, and any weight past ~100 already ranks by the lexical term alone
LEXICAL_WEIGHT_MAX = 1e6
CONFIG_NAME = "prefilling_config.json"
AUTO = "auto"  # candidates="auto": the first stage engages by itself (auto_candidates)
# The auto rule's constants (our extension; bench/results/scale_default.md and first_stage_ranks.md measure
# them): at least AUTO_PER_K * K candidates and AUTO_SQRT * sqrt(N), and only where that leaves out at least
# half the chunks. With the excess first stage the needle's chunk ranked 0-19 in 92 pass-key cases at 4K-128K
# (bench/results/first_stage_ranks*), so sqrt(N) (32 + 8 of 530 chunks at 128K) suffices; 2 sqrt(N) scored 47 + 8.
AUTO_PER_K = 8
AUTO_SQRT = 1.0
# With "auto", the best K of the first stage also bring their two neighbours (a fact cut by a chunk boundary
# lies in two chunks; measured: bench/results/scale_default.md, essays at 64K)
AUTO_NEIGHBOURS_PER_K = 1


def auto_candidates(num_chunks: int, top_k: int) -> int | None:
    """The candidate count of ``candidates="auto"``: how many chunks the first stage passes to the predictive
    score of a context of ``num_chunks`` chunks when K = ``top_k`` are kept, or None (score every chunk).

    Rule (our extension of Prefilling-dLLM, arXiv 2606.10537, which scores every chunk):
    ``n = max(AUTO_PER_K * K, ceil(AUTO_SQRT * sqrt(N)))``, used only when ``2 * n < N``. The predictive
    score costs one forward of the scoring tokens per chunk, the first stage one small forward and one
    product over the cached keys in all: once the first stage leaves out at least half the chunks, scoring
    stops paying for the chunks it ranks low. ``n`` grows as ``sqrt(N)`` (sublinear: 32 of 530 chunks at 128K
    tokens of C=256, 66 of 4237 at 1M) and never below ``AUTO_PER_K`` times K, so a chunk the first stage
    ranks anywhere in its first ``n`` still competes for K on the predictive score. With K=4 it engages from
    65 chunks on (16K tokens at C=256). Deterministic: a function of N and K alone.

    Args:
        num_chunks: N >= 1.
        top_k: K, 1 <= K.

    Returns:
        n with ``K <= n < N / 2``, or None.

    Raises:
        ValueError: N or K not an int >= 1.
    """
    for name, v in (("num_chunks", num_chunks), ("top_k", top_k)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    n = max(AUTO_PER_K * int(top_k), math.ceil(AUTO_SQRT * math.sqrt(int(num_chunks))))
    return n if 2 * n < num_chunks else None


def snap_for_chunk_size(snap: int, chunk_size: int, new_chunk_size: int) -> int:
    """A ``boundary_snap`` tolerance tuned for chunks of ``chunk_size`` tokens, carried to chunks of
    ``new_chunk_size`` as the same share of the chunk (rounded down): a checkpoint's default tolerance stays
    valid (below C) when a user picks another C. 0 stays 0."""
    return snap * new_chunk_size // chunk_size


def with_overrides(base: PrefillingConfig, given: dict) -> PrefillingConfig:
    """``dataclasses.replace(base, **given)`` for settings given over a checkpoint's defaults (the CLI's flags,
    the harness's model_args): a ``chunk_size`` given without a ``boundary_snap`` carries ``base``'s snap
    as the same share of the chunk (:func:`snap_for_chunk_size`), and ``candidates=None`` (the first stage
    off: every chunk scored) given without a ``candidate_layer`` drops ``base``'s layer, which belongs to
    the stage turned off. Raises what the replace raises."""
    given = dict(given)
    if "chunk_size" in given and "boundary_snap" not in given and base.boundary_snap:
        given["boundary_snap"] = snap_for_chunk_size(base.boundary_snap, base.chunk_size, given["chunk_size"])
    if "candidates" in given and given["candidates"] is None and "candidate_layer" not in given:
        given["candidate_layer"] = None
    return dataclasses.replace(base, **given)


def checkpoint_config(model, chunk_size: int | None = None, boundary_snap: int | None = None) -> PrefillingConfig:
    """The defaults of ``model``'s checkpoint (:meth:`PrefillingConfig.from_pretrained` of its ``model_dir``;
    the paper's without one), with ``chunk_size`` and ``boundary_snap`` when given (None: the file's; a
    document's two, when answering from it with no config). Raises what ``from_pretrained`` raises."""
    given = {} if chunk_size is None else {"chunk_size": chunk_size}
    if boundary_snap is not None:
        given["boundary_snap"] = boundary_snap
    return PrefillingConfig.from_pretrained(getattr(model, "model_dir", None), **given)


class TopKError(ValueError):
    """K above the context's chunk count (:meth:`PrefillingConfig.for_chunks` with ``explicit``).

    Attributes:
        top_k: the K asked for. num_chunks: the chunks there are (snapped, when ``boundary_snap``).
        cfg: the config it was asked with.
    """

    def __init__(self, top_k: int, num_chunks: int, cfg: PrefillingConfig):
        self.top_k, self.num_chunks, self.cfg = top_k, num_chunks, cfg
        super().__init__(
            f"top_k={top_k} exceeds the {num_chunks} chunk(s) of this context ({chunking(cfg)}); lower top_k or "
            "chunk_size, or pass top_k=None (CLI: --top-k all) to keep every chunk"
        )


def chunking(cfg: PrefillingConfig, flags: bool = False) -> str:
    """How ``cfg`` cuts a context, in words for an error message: ``chunk_size 256, boundaries snapped to
    sentence ends within 64 tokens`` (``flags``: the CLI's ``--chunk-size`` / ``--boundary-snap`` names)."""
    c, s = ("--chunk-size ", "--boundary-snap ") if flags else ("chunk_size ", "boundary_snap ")
    out = f"{c}{cfg.chunk_size}"
    if cfg.boundary_snap:
        out += f", boundaries snapped to sentence ends ({s}{cfg.boundary_snap})"
    return out


@dataclass(frozen=True)
class PrefillingConfig:
    """Configuration of chunked prefill, predictive chunk scoring and two-level sparsity.

    Every integer field must be an integer (``int`` or a numpy integer; not a bool, not a float such
    as 2.5); a bad value is a ``ValueError`` naming the field, raised here (also for
    ``prefilling_config.json``).

    Attributes:
        chunk_size: C, context tokens per chunk (a BOS anchor is added to each). >= 1, and C + 1 within
            the model's trained positions (checked when chunks are encoded).
        top_k: K, chunks kept after scoring (inter-chunk sparsity). None keeps every chunk.
        token_budget: B, context tokens kept per kept chunk and per layer and KV head
            (intra-chunk sparsity; the BOS anchor is kept on top). None keeps all. 1 <= B <= C.
        draft_tokens: m, mask slots of the preliminary (context-free) diffusion pass whose
            confident predictions become pseudo-labels.
        draft_threshold: a draft slot is confirmed when its top-1 probability is >= this
            (the single most confident slot is always confirmed).
        position_mode: ``continuous`` (k-th kept chunk right after the (k-1)-th, query after the
            last; the reference default), ``reuse`` (every chunk at the same positions right after
            the prefix) or ``absolute`` (each token at its position in the original prompt).
        cache_mode: ``independent`` (decode over the chunk caches of the prefill) or ``joint``
            (re-encode prefix + kept chunks + query once after selection).
        score_mode: ``dllm`` (mask the scored tokens and predict them, bidirectionally) or
            ``causal`` (next-token log-probs under a causal mask over the scoring tokens, the
            reference code's variant for AR-initialised models with shifted logits).
        score_terms: which of ``self_info`` (s_I), ``pseudo_label`` (s_P) and ``answer_confidence``
            (s_C, our variant: the top-1 log-probability of the draft slots given chunk + query) and
            ``draft_contrast`` (s_C - s_P, our variant) make up the chunk score ``s`` (default the
            paper's ``s = s_I + s_P``).
        pool_kernel: odd max-pool width applied to token scores before the top-B choice.
        query_window: trailing query tokens used as scoring tokens (None = the whole query).
        prefill_batch: chunks encoded per forward during prefill (None = as many as fit in a share of the
            device's free memory, :func:`dllm.prefilling.memory.default_prefill_batch`).
        anchor_token_id: the token put before every chunk (and looked for at the start of a
            prompt given as ``input_ids``). None = :func:`resolve_anchor_token_id`'s choice: the
            tokenizer's BOS, else the checkpoint's ``bos_token_id``.
        boundary_snap: 0 (the paper: fixed chunks of C tokens) or a tolerance in tokens, ``0 <= tol <
            chunk_size``: each chunk boundary moves back to just after the last sentence or paragraph end
            (a token whose text ends in ``.``, ``!``, ``?`` or holds a newline) within ``tol`` tokens of
            it, so a sentence shorter than ``tol`` is never cut by a boundary (our extension;
            :func:`dllm.prefilling.chunks.snapped_chunks`). Chunks stay at most C tokens.
        redundancy_threshold: None (the paper: plain top-K) or a Jaccard similarity in (0, 1]: a chunk
            whose set of token 8-grams overlaps an already kept chunk's by at least this much is passed
            over while other chunks remain, so near-copies (repeated boilerplate) do not fill K
            (our extension; :func:`dllm.prefilling.selection.select_chunks`).
        candidates: None (the paper: every chunk is scored), n >= 1, or ``"auto"``: a cheap first stage (how far
            the largest attention logits of the context-free scoring tokens' queries on each chunk's cached keys
            stand out from the document's median chunk, over the layers or in layer ``candidate_layer``,
            :func:`dllm.prefilling.selection.first_stage_scores`) keeps the n best chunks and only
            they get the predictive score (our extension). Fewer than K candidates are raised to K.
            ``"auto"`` picks n from the chunk count (:func:`auto_candidates`: sublinear in N, engaged only
            once it leaves out half the chunks) and adds the neighbours of the K best (:meth:`neighbours_of`);
            :meth:`candidate_count` is the rule every path applies.
        candidate_layer: the one layer of the first stage (negative counts from the last), None = all layers;
            only with ``candidates`` (a ValueError without: the layer of a stage that does not run).
            A fresh context (no document cache) with the first stage engaged and a layer set is encoded in two
            passes: every chunk only up to that layer's keys, then the candidates in full
            (:func:`dllm.prefilling.chunks.encode_candidates`).
        adaptive_k: None (the paper: a fixed K) or a margin m > 0: K is chosen per question between 1 and
            ``top_k`` (the ceiling; all chunks when None) by how far the best scores stand out: the chunks above
            the first drop between consecutive ranked scores of at least m robust spreads (1.4826 x the
            median absolute deviation of the chunks' scores), ``top_k`` when no drop is that large (our
            extension; :func:`dllm.prefilling.selection.adaptive_top_k`; 1.2533 x the mean absolute deviation
            when half the scores or more tie). Below the ceiling the best chunk's better neighbour is kept too
            when it ranks among the ``top_k`` best (a fact straddling a boundary scores high in both chunks:
            :func:`dllm.prefilling.selection.kept_chunks`). m = 1.5 was chosen
            on held-out registers (``bench/results/adaptive_k.md``): the needle chunk kept as often as the best
            fixed K with about half the tokens, and the bundled pass keys as with K=4.
        lexical_weight: 0 (the paper: the predictive score alone) or a weight w > 0: the chunk score becomes
            ``z(predictive) + w * z(lexical)``, z-scored over the scored chunks, the lexical term being the
            idf-weighted share of the query's token n-grams a chunk holds (no model forward; our extension,
            :mod:`dllm.prefilling.lexical`). With a first stage, the K chunks of best lexical score join its
            candidates, so a chunk the query names is scored even where the first stage ranks it low. At most
            :data:`LEXICAL_WEIGHT_MAX` (1e6: past ~1e38 / sqrt(N) the fused score would overflow to inf).
    """

    chunk_size: int = 1024
    top_k: int | None = 4
    token_budget: int | None = None
    draft_tokens: int = 4
    draft_threshold: float = 0.9
    position_mode: str = "continuous"
    cache_mode: str = "independent"
    score_mode: str = "dllm"
    score_terms: tuple = DEFAULT_TERMS
    pool_kernel: int = 7
    query_window: int | None = None
    prefill_batch: int | None = None
    anchor_token_id: int | None = None
    boundary_snap: int = 0
    redundancy_threshold: float | None = None
    candidates: int | str | None = None
    candidate_layer: int | None = None
    adaptive_k: float | None = None
    lexical_weight: float = 0.0

    def __post_init__(self):
        # Integer knobs must be real ints: 2.5 or True would pass a range check and fail (or run as 1) later.
        for name, optional in (
            ("chunk_size", False), ("top_k", True), ("token_budget", True), ("draft_tokens", False),
            ("pool_kernel", False), ("query_window", True), ("prefill_batch", True), ("anchor_token_id", True),
            ("boundary_snap", False), ("candidates", True), ("candidate_layer", True),
        ):  # fmt: skip
            value = getattr(self, name)
            if value is None and optional or (name == "candidates" and value == AUTO):
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                also = " or 'auto'" if name == "candidates" else ""
                raise ValueError(f"{name} must be an int{also}{' or None' if optional else ''}, got {value!r}")
            object.__setattr__(self, name, int(value))  # numpy ints become plain ints (JSON, hashing)
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size (C) must be an int >= 1, got {self.chunk_size!r}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k (K) must be >= 1 or None, got {self.top_k}")
        if self.token_budget is not None and not 1 <= self.token_budget <= self.chunk_size:
            raise ValueError(
                f"token_budget (B) must be in [1, chunk_size={self.chunk_size}] or None, got {self.token_budget}"
            )
        if self.draft_tokens < 1:
            raise ValueError(f"draft_tokens must be >= 1, got {self.draft_tokens}")
        if isinstance(self.draft_threshold, bool) or not isinstance(self.draft_threshold, numbers.Real):
            raise ValueError(f"draft_threshold must be a real number, got {self.draft_threshold!r}")
        if not 0 < self.draft_threshold <= 1:  # (before float(): an integer of 400 digits overflows it)
            raise ValueError(f"draft_threshold must be in (0, 1], got {self.draft_threshold}")
        object.__setattr__(self, "draft_threshold", float(self.draft_threshold))
        if not 0 < self.draft_threshold <= 1:
            raise ValueError(f"draft_threshold must be in (0, 1], got {self.draft_threshold}")
        for name, val, allowed in (
            ("position_mode", self.position_mode, POSITION_MODES),
            ("cache_mode", self.cache_mode, CACHE_MODES),
            ("score_mode", self.score_mode, SCORE_MODES),
        ):
            if val not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {val!r}")
        terms = tuple(self.score_terms)
        if not terms or any(t not in SCORE_TERMS for t in terms):
            raise ValueError(f"score_terms must be a non-empty subset of {SCORE_TERMS}, got {self.score_terms!r}")
        twice = sorted({t for t in terms if terms.count(t) > 1})
        if twice:  # the chunk score sums its terms: a repeated one would count twice (as the CLI says)
            raise ValueError(f"score_terms names {', '.join(twice)} more than once; name each term once")
        object.__setattr__(self, "score_terms", terms)
        if self.pool_kernel < 1 or self.pool_kernel % 2 == 0:
            raise ValueError(f"pool_kernel must be odd and >= 1, got {self.pool_kernel}")
        if self.query_window is not None and self.query_window < 1:
            raise ValueError(f"query_window must be >= 1 or None, got {self.query_window}")
        if self.prefill_batch is not None and self.prefill_batch < 1:
            raise ValueError(f"prefill_batch must be >= 1 or None, got {self.prefill_batch}")
        if self.anchor_token_id is not None and self.anchor_token_id < 0:
            raise ValueError(f"anchor_token_id must be an int >= 0 or None, got {self.anchor_token_id!r}")
        if not 0 <= self.boundary_snap < self.chunk_size:
            raise ValueError(
                f"boundary_snap must be in [0, chunk_size={self.chunk_size}) tokens, got {self.boundary_snap}"
            )
        r = self.redundancy_threshold
        if r is not None:
            if isinstance(r, bool) or not isinstance(r, numbers.Real) or not 0 < r <= 1:
                raise ValueError(f"redundancy_threshold must be a real number in (0, 1] (None = off), got {r!r}")
            object.__setattr__(self, "redundancy_threshold", float(r))
        if self.candidates not in (None, AUTO) and self.candidates < 1:
            raise ValueError(f"candidates must be >= 1, 'auto' or None, got {self.candidates}")
        if self.candidate_layer is not None and self.candidates is None:  # the layer of a stage that does not run
            raise ValueError(
                f"candidate_layer={self.candidate_layer} needs candidates (the first stage it belongs to is off "
                "with candidates=None): give candidates too, or leave candidate_layer unset"
            )
        m = self.adaptive_k
        if m is not None:
            try:
                fm = float(m) if isinstance(m, numbers.Real) and not isinstance(m, bool) else math.nan
            except OverflowError:  # an int past float's range
                fm = math.inf
            if not math.isfinite(fm) or fm <= 0:
                raise ValueError(f"adaptive_k must be a finite real number > 0 (a margin), got {m!r}")
            object.__setattr__(self, "adaptive_k", fm)
        w = self.lexical_weight
        try:
            fw = float(w) if isinstance(w, numbers.Real) and not isinstance(w, bool) else math.nan
        except OverflowError:  # an int past float's range
            fw = math.inf
        if not math.isfinite(fw) or not 0 <= fw <= LEXICAL_WEIGHT_MAX:
            raise ValueError(
                f"lexical_weight must be a real number in [0, {LEXICAL_WEIGHT_MAX:g}] (0 = off), got {w!r}"
            )
        object.__setattr__(self, "lexical_weight", fw)

    @classmethod
    def from_pretrained(cls, model_dir: str | None, **overrides) -> PrefillingConfig:
        """The checkpoint's tuned defaults (``model_dir/prefilling_config.json``), then ``overrides``.

        A directory without the file (or ``model_dir=None``) gets the paper's defaults
        (C=1024, K=4, s = s_I + s_P). Keyword overrides win over the file, and a keyword means what it
        means to :class:`PrefillingConfig`: ``top_k=None`` keeps every chunk, ``token_budget=None`` every
        token (None is a value, not "not given": leave a keyword out to keep the file's value; a field
        that cannot be None, such as ``chunk_size=None``, is an error). A ``chunk_size`` override
        without a ``boundary_snap`` one keeps the file's tolerance as the same share of the chunk
        (:func:`snap_for_chunk_size`: 64 of 256 becomes 16 of 64); ``candidates=None`` without a
        ``candidate_layer`` one also drops the file's layer (the first stage it belongs to is off).

        Args:
            model_dir: checkpoint directory, or None.
            **overrides: any :class:`PrefillingConfig` field.

        Raises:
            TypeError: a keyword that is not a :class:`PrefillingConfig` field.
            ValueError: invalid JSON, a field name the dataclass does not have, or an invalid value in
                the file (the message names the file); an invalid keyword value (the message names the
                keyword argument, and the file whose values it was combined with).
        """
        values = {}
        path = os.path.join(model_dir, CONFIG_NAME) if model_dir else None
        if path and os.path.isfile(path):
            values = read_json(path)
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(values) - known)
            if unknown:
                raise ValueError(f"{path}: unknown field(s) {unknown}; known: {sorted(known)}")
            if "score_terms" in values:
                if not isinstance(values["score_terms"], list):
                    raise ValueError(f"{path}: score_terms must be a JSON array, got {values['score_terms']!r}")
                values["score_terms"] = tuple(values["score_terms"])
        # the file's values are checked alone first: its snap is carried to an overriding chunk_size only
        # once both are known to be valid integers (a "256" or true in the file is its own error)
        try:
            base = cls(**values)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path or 'PrefillingConfig'}: {e}") from e
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(
                f"PrefillingConfig.from_pretrained: unknown keyword argument(s) {unknown}; known: {sorted(known)}"
            )
        try:
            return with_overrides(base, overrides)
        except (TypeError, ValueError) as e:
            given = ", ".join(f"{k}={v!r}" for k, v in overrides.items())
            over = f" over {path}'s values" if path and values else ""
            raise ValueError(f"PrefillingConfig.from_pretrained keyword argument(s) {given}{over}: {e}") from e

    def for_chunks(self, num_chunks: int, *, explicit: bool = False) -> PrefillingConfig:
        """This config for a context cut into ``num_chunks`` chunks: the one rule of K that the library, the
        CLI, ``dllm eval`` and the harness share.

        ``num_chunks`` is the real chunk count N: with ``boundary_snap`` the snapped chunks
        (:func:`dllm.prefilling.chunks.count_chunks`, ``DocumentCache.num_chunks``), not ``ceil(L / C)``.

        Returns:
            itself when K <= N or K is None; when K > N and not ``explicit`` (a checkpoint's default K), the
            same with ``top_k=None`` (keep every chunk).

        Raises:
            TopKError: K > N and ``explicit`` (a K the user asked for).
            ValueError: ``num_chunks`` not an int >= 1.
        """
        if isinstance(num_chunks, bool) or not isinstance(num_chunks, numbers.Integral) or num_chunks < 1:
            raise ValueError(f"num_chunks must be an int >= 1, got {num_chunks!r}")
        if self.top_k is None or self.top_k <= num_chunks:
            return self
        if explicit:
            raise TopKError(self.top_k, int(num_chunks), self)
        return dataclasses.replace(self, top_k=None)

    def candidate_count(self, num_chunks: int, top_k: int) -> int | None:
        """How many chunks the first stage passes to the predictive score for a context of ``num_chunks``
        chunks of which ``top_k`` are kept, or None when every chunk is scored: the one rule of the library,
        the CLI, ``dllm eval``, the harness and torchrun.

        ``candidates`` None: None. An int n: ``max(n, K)`` when that is below N, else None. ``"auto"``:
        :func:`auto_candidates`.

        Raises:
            ValueError: N or K not an int >= 1.
        """
        if self.candidates is None:
            return None
        if self.candidates == AUTO:
            return auto_candidates(num_chunks, top_k)
        n = max(self.candidates, top_k)
        return n if n < num_chunks else None

    def neighbours_of(self, top_k: int) -> int:
        """How many of the first stage's best chunks bring their two neighbours into the candidates
        (:func:`dllm.prefilling.selection.first_stage_candidates`): ``AUTO_NEIGHBOURS_PER_K * K`` with
        ``candidates="auto"``, else 0 (an explicit n is n chunks)."""
        return AUTO_NEIGHBOURS_PER_K * top_k if self.candidates == AUTO else 0

    def changed_fields(self) -> dict:
        """The fields that differ from the paper's defaults (what :meth:`save_pretrained` writes)."""
        base = asdict(PrefillingConfig())
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items() if v != base[k]}

    def save_pretrained(self, model_dir: str) -> str:
        """Write :meth:`changed_fields` to ``model_dir/prefilling_config.json``; returns the path."""
        path = os.path.join(model_dir, CONFIG_NAME)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.changed_fields(), f, indent=2)
            f.write("\n")
        return path


def resolve_anchor_token_id(model_config, tokenizer, cfg: PrefillingConfig) -> tuple[int, str]:
    """The chunk anchor id and where it came from.

    Args:
        model_config: the model's :class:`dllm.model.config.ModelConfig`.
        tokenizer: its transformers tokenizer, or None.
        cfg: the prefilling configuration (its ``anchor_token_id`` overrides).

    Order: ``cfg.anchor_token_id`` (``"PrefillingConfig.anchor_token_id"``), then the tokenizer's
    BOS (``"tokenizer"``; Dream: ``<|beginoftext|>`` 151665), then the checkpoint's ``bos_token_id``
    (``"config"``: ``config.json``, else ``generation_config.json``; LLaDA: 126080). The tokenizer
    comes first because Dream's ``config.json`` names 151643 ``<|endoftext|>``, which is also its
    EOS and PAD: an anchor that reads as "end of text" before every chunk. The paper anchors each
    chunk with the model's BOS (arXiv 2606.10537, chunked prefill).

    Returns:
        (token id, source).

    Raises:
        ValueError: no source defines one, or the id is outside the vocabulary or the mask id.
    """
    if cfg.anchor_token_id is not None:
        anchor, source = cfg.anchor_token_id, "PrefillingConfig.anchor_token_id"
    elif tokenizer is not None and tokenizer.bos_token_id is not None:
        anchor, source = int(tokenizer.bos_token_id), "tokenizer"
    elif model_config.bos_token_id is not None:
        anchor, source = int(model_config.bos_token_id), "config"
    else:
        raise ValueError(
            "the model defines no BOS token id (tokenizer, config.json, generation_config.json); chunks need an "
            "anchor: pass PrefillingConfig(anchor_token_id=...)"
        )
    if not 0 <= anchor < model_config.vocab_size or anchor == model_config.mask_token_id:
        raise ValueError(f"anchor token id {anchor} ({source}) is outside the vocabulary or is the mask token")
    return anchor, source
