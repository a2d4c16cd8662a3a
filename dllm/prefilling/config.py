"""``PrefillingConfig``: the knobs of Prefilling-dLLM (arXiv 2606.10537), with the reference code's defaults."""

from __future__ import annotations

from dataclasses import dataclass

POSITION_MODES = ("reuse", "continuous", "absolute")
CACHE_MODES = ("independent", "joint")
SCORE_MODES = ("dllm", "causal")
SCORE_TERMS = ("self_info", "pseudo_label", "answer_confidence", "draft_contrast")
DEFAULT_TERMS = ("self_info", "pseudo_label")


@dataclass(frozen=True)
class PrefillingConfig:
    """Configuration of chunked prefill, predictive chunk scoring and two-level sparsity.

    Attributes:
        chunk_size: C, context tokens per chunk (a BOS anchor is added to each). >= 1.
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
        prefill_batch: chunks encoded per forward during prefill (None = all at once).
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

    def __post_init__(self):
        if not isinstance(self.chunk_size, int) or self.chunk_size < 1:
            raise ValueError(f"chunk_size (C) must be an int >= 1, got {self.chunk_size!r}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k (K) must be >= 1 or None, got {self.top_k}")
        if self.token_budget is not None and not 1 <= self.token_budget <= self.chunk_size:
            raise ValueError(
                f"token_budget (B) must be in [1, chunk_size={self.chunk_size}] or None, got {self.token_budget}"
            )
        if self.draft_tokens < 1:
            raise ValueError(f"draft_tokens must be >= 1, got {self.draft_tokens}")
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
        object.__setattr__(self, "score_terms", terms)
        if self.pool_kernel < 1 or self.pool_kernel % 2 == 0:
            raise ValueError(f"pool_kernel must be odd and >= 1, got {self.pool_kernel}")
        if self.query_window is not None and self.query_window < 1:
            raise ValueError(f"query_window must be >= 1 or None, got {self.query_window}")
        if self.prefill_batch is not None and self.prefill_batch < 1:
            raise ValueError(f"prefill_batch must be >= 1 or None, got {self.prefill_batch}")
