"""Rotary position embedding (RoPE), its static scaling variants, and rotation of cached keys by a position delta.

RoPE (Su et al., RoFormer) rotates each pair of channels ``(i, i + D/2)`` of q and
k by the angle ``position * inv_freq[i]`` (the "rotate half" layout used by
Qwen2/Dream, Llama and LLaDA). Attention logits then depend only on the
relative position, so a chunk encoded alone at local positions can be moved to
any position by one more rotation: ``R(p + delta) = R(delta) R(p)``.

Frequencies. The plain variant uses ``inv_freq[i] = theta^(-2i/D)``. The static
scaling variants of a checkpoint's ``rope_scaling`` (``linear`` position
interpolation, ``yarn``, ``llama3``) are computed by transformers' own
``ROPE_INIT_FUNCTIONS`` (so we follow the installed transformers exactly); they
change ``inv_freq`` and, for YaRN, multiply cos/sin by an ``attention_factor``
(``0.1 ln(factor) + 1`` by default, Peng et al. 2023). Variants whose frequencies
depend on the current sequence length (``dynamic`` NTK, ``longrope``) are rejected:
a chunk cached at one length could not be reused at another. A larger
``rope_theta`` (static NTK extrapolation, as LongLLaDA, Liu et al. 2025, does for
LLaDA) is just another base.

A rotation of cached keys uses the (scaled) ``inv_freq`` but never the attention
factor: the keys already carry it from their encoding, ``R(delta) (a R(p) k) = a R(p + delta) k``.

Angles are computed in float64 and cast to float32: at 32K positions an fp32
product ``position * inv_freq`` is off by ~1e-3 rad, which would make
"rotate by delta" and "encode at p + delta" disagree more than they must.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dllm.model.hf import quiet_transformers

# rope_scaling types whose frequencies do not depend on the sequence length.
STATIC_ROPE_TYPES = ("default", "linear", "yarn", "llama3")


def inv_frequencies(head_dim: int, theta: float, device=None) -> torch.Tensor:
    """Inverse frequencies ``theta^(-2i/D)``, i = 0..D/2-1, float64 ``[D/2]``.

    Raises:
        ValueError: odd head_dim.
    """
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    exponent = torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim
    return 1.0 / (theta**exponent)


def rope_type_of(rope_scaling: dict | None) -> str:
    """The variant a ``rope_scaling`` dict names (``rope_type``, or the older ``type`` key); ``default`` for None."""
    if not rope_scaling:
        return "default"
    return str(rope_scaling.get("rope_type", rope_scaling.get("type", "default")))


def scaled_inv_frequencies(
    head_dim: int,
    theta: float,
    rope_scaling: dict | None = None,
    *,
    max_position_embeddings: int | None = None,
) -> tuple[torch.Tensor, float]:
    """``inv_freq`` and ``attention_factor`` of a static RoPE variant, from transformers' RoPE init functions.

    Args:
        head_dim: D (even).
        theta: RoPE base (the checkpoint's ``rope_theta``, or an override).
        rope_scaling: the checkpoint's ``rope_scaling`` dict (None = plain RoPE), e.g.
            ``{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}``.
        max_position_embeddings: the config's field (YaRN and llama3 read it as the pretraining
            window when ``rope_scaling`` does not carry ``original_max_position_embeddings``).

    Returns:
        (inv_freq float64 CPU ``[D/2]`` in rad per position, attention_factor: the factor transformers
        multiplies cos and sin by; 1.0 except for YaRN).

    Raises:
        ValueError: odd head_dim, a variant outside :data:`STATIC_ROPE_TYPES`, or a ``rope_scaling``
            missing a field its variant needs (e.g. ``factor``).
    """
    kind = rope_type_of(rope_scaling)
    if kind not in STATIC_ROPE_TYPES:
        raise ValueError(
            f"rope_scaling type {kind!r} is not supported: only static variants {STATIC_ROPE_TYPES} "
            "(dynamic/longrope change the frequencies with the sequence length, so chunk keys cached at one "
            "length could not be reused); for NTK-style extrapolation pass a larger rope_theta instead"
        )
    if kind == "default":
        return inv_frequencies(head_dim, theta), 1.0
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    if rope_scaling.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial_rotary_factor != 1 (partial RoPE) is not supported")
    from transformers import Qwen2Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    # Any config class that carries these fields works; transformers 4.46 reads config.rope_theta and
    # config.rope_scaling, 5.x reads config.rope_parameters, and Qwen2Config fills both from the same kwargs.
    # One head of width D, so that hidden_size // num_attention_heads == head_dim as well.
    fields = {k: v for k, v in rope_scaling.items() if k != "rope_theta"}  # our theta (maybe an override) wins
    kwargs = dict(hidden_size=head_dim, num_attention_heads=1, num_key_value_heads=1, rope_theta=float(theta))
    if max_position_embeddings:
        kwargs["max_position_embeddings"] = int(max_position_embeddings)
    try:
        with quiet_transformers():
            cfg = Qwen2Config(**kwargs, rope_scaling=fields)
            cfg.head_dim = head_dim
            inv, attention_factor = ROPE_INIT_FUNCTIONS[kind](cfg, torch.device("cpu"))
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise ValueError(f"rope_scaling {rope_scaling!r} is not a valid {kind!r} RoPE scaling: {e!r}") from e
    return inv.to(torch.float64), float(attention_factor)


def rope_cos_sin(
    positions: torch.Tensor,
    head_dim: int,
    theta: float,
    *,
    inv_freq: torch.Tensor | None = None,
    attention_factor: float = 1.0,
):
    """cos/sin tables for integer positions.

    Args:
        positions: int tensor ``[..., L]`` (any leading shape; negative allowed, used for deltas).
        head_dim: D (even).
        theta: RoPE base (ignored when ``inv_freq`` is given).
        inv_freq: optional ``[D/2]`` inverse frequencies of a scaled variant
            (:func:`scaled_inv_frequencies`); default ``theta^(-2i/D)``.
        attention_factor: multiplies cos and sin (YaRN's temperature; 1.0 otherwise).

    Returns:
        (cos, sin), each float32 ``[..., L, D]`` in the rotate-half layout
        (the D/2 angles repeated twice).
    """
    if inv_freq is None:
        inv = inv_frequencies(head_dim, theta, device=positions.device)
    else:
        inv = inv_freq.to(device=positions.device, dtype=torch.float64)
    ang = positions.to(torch.float64)[..., None] * inv  # [..., L, D/2]
    ang = torch.cat([ang, ang], dim=-1)
    cos, sin = torch.cos(ang), torch.sin(ang)
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    return cos.to(torch.float32), sin.to(torch.float32)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, L, H, D]`` by per-token angles.

    Args:
        x: q or k, token-major ``[B, L, H, D]`` (any float dtype).
        cos, sin: ``[B, L, D]`` or ``[L, D]`` float32 from :func:`rope_cos_sin`.

    Returns:
        Tensor like ``x`` (same dtype); computed in fp32.
    """
    c = cos.unsqueeze(-2)  # broadcast over heads
    s = sin.unsqueeze(-2)
    xf = x.float()
    return (xf * c + _rotate_half(xf) * s).to(x.dtype)


def rotate_keys(
    k: torch.Tensor, delta: torch.Tensor | int, theta: float, *, inv_freq: torch.Tensor | None = None
) -> torch.Tensor:
    """Move RoPE'd keys by ``delta`` positions: ``R(delta) k`` (a pure rotation).

    Args:
        k: keys ``[..., L, H, D]`` already rotated at some positions p.
        delta: int, or int tensor broadcastable to ``k.shape[:-2]`` (per token).
        theta: RoPE base of the model (ignored when ``inv_freq`` is given).
        inv_freq: optional ``[D/2]`` inverse frequencies of a scaled variant. No attention
            factor is applied here: the keys carry it from their encoding.

    Returns:
        Keys as if they had been encoded at ``p + delta`` (same dtype as k).
    """
    d = k.shape[-1]
    if not torch.is_tensor(delta):
        if delta == 0:
            return k
        delta = torch.tensor(delta, device=k.device)
    delta = delta.to(k.device).expand(k.shape[:-2])
    cos, sin = rope_cos_sin(delta, d, theta, inv_freq=inv_freq)  # [..., L, D]
    return apply_rope(k, cos, sin)


@dataclass(frozen=True, eq=False)
class RotaryEmbedding:
    """The RoPE of one model: frequencies fixed at load time, tables on demand.

    Attributes:
        head_dim: D.
        theta: RoPE base.
        rope_type: one of :data:`STATIC_ROPE_TYPES`.
        inv_freq: float64 CPU ``[D/2]``.
        attention_factor: cos/sin multiplier (YaRN), 1.0 otherwise.
    """

    head_dim: int
    theta: float
    rope_type: str
    inv_freq: torch.Tensor
    attention_factor: float = 1.0
    _on_device: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_config(cls, cfg) -> RotaryEmbedding:
        """From a :class:`dllm.model.config.ModelConfig` (``head_dim``, ``rope_theta``, ``rope_scaling``,
        ``max_position_embeddings``). A config that already holds its table (``cfg.rope``, built once when
        a :class:`~dllm.model.config.ModelConfig` is validated) returns that one instead of computing it again.
        Raises ValueError as :func:`scaled_inv_frequencies`."""
        cached = getattr(cfg, "_rope", None)
        if isinstance(cached, cls):
            return cached
        with torch.device("cpu"):  # the model itself may be built under a meta-device context
            inv, factor = scaled_inv_frequencies(
                cfg.head_dim,
                cfg.rope_theta,
                cfg.rope_scaling,
                max_position_embeddings=cfg.max_position_embeddings,
            )
        return cls(cfg.head_dim, float(cfg.rope_theta), rope_type_of(cfg.rope_scaling), inv, factor)

    def _inv(self, device) -> torch.Tensor:
        key = str(device)
        if key not in self._on_device:
            self._on_device[key] = self.inv_freq.to(device)
        return self._on_device[key]

    def cos_sin(self, positions: torch.Tensor):
        """(cos, sin) float32 ``[..., L, D]`` for ``positions [..., L]``, attention factor included."""
        return rope_cos_sin(
            positions,
            self.head_dim,
            self.theta,
            inv_freq=self._inv(positions.device),
            attention_factor=self.attention_factor,
        )

    def rotate_keys(self, k: torch.Tensor, delta: torch.Tensor | int) -> torch.Tensor:
        """:func:`rotate_keys` with this model's frequencies (no attention factor): keys ``k``
        ``[..., L, H, D]`` (any float dtype, kept) moved by ``delta`` positions (an int, or an int tensor
        broadcastable to ``k.shape[:-2]``); returns a new tensor of ``k``'s shape and dtype."""
        return rotate_keys(k, delta, self.theta, inv_freq=self._inv(k.device))
