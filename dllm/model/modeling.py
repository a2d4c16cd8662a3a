"""One bidirectional decoder for both dLLM families (Dream / LLaDA).

Both families are pre-norm Llama-style transformers: RMSNorm -> attention
(RoPE, GQA) -> residual -> RMSNorm -> SwiGLU MLP -> residual, final RMSNorm, LM
head. They differ only in q/k/v bias, weight names (handled by
:mod:`dllm.model.weights`) and the logit shift. Attention is **bidirectional**: a
diffusion LM has no causal mask.

The forward takes explicit ``position_ids`` and an optional
:class:`~dllm.model.kv_cache.StaticKVCache`. With a cache, the live tokens attend to
the cached segments plus themselves through ``triton_kernels.split_s_attention``
(partials + LSE merge; Triton on CUDA, the torch reference on CPU). Without one,
attention is torch SDPA over the live tokens, optionally with a mask.

Fused elementwise path (CUDA): between the GEMMs a layer runs, in torch, about 34 small
elementwise kernels (RMSNorm's casts/square/mean/rsqrt/products twice, RoPE's seven kernels
for q and again for k, the residual adds, SiLU and its product). On CUDA the model runs three
Triton kernels instead (:func:`triton_kernels.add_rms_norm`, which also does the residual add,
:func:`triton_kernels.rope_qk` and :func:`triton_kernels.swiglu`): four launches per layer,
the same rounding steps as the torch path. The fused path also runs one GEMM for q, k and v and one for
gate and up (:mod:`dllm.model.merged_linear`: the parameters become views of one merged tensor, same names,
same memory): the five projection GEMMs before the output and down projections become two, as long as those
projections are the plain ``nn.Linear`` modules loaded (a LoRA wrapper, a swapped-in layer or a forward hook
added later is called as a module: :meth:`dllm.model.merged_linear.MergedProjections.follows`).
``DiffusionLM.fused_ops`` chooses: ``None`` (default)
= on for CUDA weights when the ops dispatch to Triton and ``PREFILLING_DLLM_FUSED`` is not ``0``;
``True`` forces it (a CPU test does, through the Triton interpreter); ``False`` turns it off.
CPU keeps the torch path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

import triton_kernels
from dllm.model.config import ModelConfig
from dllm.model.kv_cache import StaticKVCache
from dllm.model.merged_linear import MergedProjections, apply_keeping_merged
from dllm.model.rope import RotaryEmbedding, apply_rope
from triton_kernels._dispatch import check_values_enabled, resolve_backend

FUSED_ENV = "PREFILLING_DLLM_FUSED"  # "0" turns the fused elementwise path off (see the module docstring)


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32, weight applied in the input dtype (Qwen2/LLaDA convention)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.hq, self.hkv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.hq * self.d, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.hkv * self.d, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.hkv * self.d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.hq * self.d, cfg.hidden_size, bias=False)
        self.qkv = MergedProjections(self.q_proj, self.k_proj, self.v_proj)  # the fused path's one GEMM

    def _apply(self, fn, recurse=True):  # .to() / .half() / to_empty: keep the merged layout
        return apply_keeping_merged(self, [self.qkv], fn, recurse)

    def forward(self, x, cos, sin, cache_kv, cache, attn_mask, hook, layer_idx, live_lens=None, fused=False):
        b, n, _ = x.shape
        if fused:  # q and k rotated by one kernel
            if self.qkv.follows(self.q_proj, self.k_proj, self.v_proj):  # one GEMM for q, k, v, read in place
                nq, nk = self.hq * self.d, self.hkv * self.d
                qkv = F.linear(x, *self.qkv.weights())  # [B, L, (Hq + 2 Hkv) D]
                q = qkv[..., :nq].view(b, n, self.hq, self.d)
                k = qkv[..., nq : nq + nk].view(b, n, self.hkv, self.d)
                v = qkv[..., nq + nk :].view(b, n, self.hkv, self.d)  # a strided view (row stride (Hq + 2 Hkv) D)
            else:  # a projection wrapped, swapped or hooked since loading: the modules themselves
                q = self.q_proj(x).view(b, n, self.hq, self.d)
                k = self.k_proj(x).view(b, n, self.hkv, self.d)
                v = self.v_proj(x).view(b, n, self.hkv, self.d)
            q, k = triton_kernels.rope_qk(q, k, cos, sin, backend="triton")
        else:
            q = apply_rope(self.q_proj(x).view(b, n, self.hq, self.d), cos, sin)  # [B, L, Hq, D]
            k = apply_rope(self.k_proj(x).view(b, n, self.hkv, self.d), cos, sin)  # [B, L, Hkv, D]
            v = self.v_proj(x).view(b, n, self.hkv, self.d)
        if hook is not None:
            hook(layer_idx, q, k, v)
        if cache is None:
            o = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=attn_mask, enable_gqa=True
            ).transpose(1, 2)
        else:
            k_pool, v_pool = cache_kv
            k_live, v_live = (None, None) if cache.live_in_pool else (k, v)  # (the hook wrote k, v into the pools)
            o, _ = triton_kernels.split_s_attention(
                q, k_pool, v_pool, cache.seg_slots, cache.seg_lens, k_live, v_live, live_lens=live_lens
            )
        return self.o_proj(o.reshape(b, n, self.hq * self.d)), k, v


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up = MergedProjections(self.gate_proj, self.up_proj)  # the fused path's one GEMM

    def _apply(self, fn, recurse=True):  # .to() / .half() / to_empty: keep the merged layout
        return apply_keeping_merged(self, [self.gate_up], fn, recurse)

    def forward(self, x, fused=False):
        if fused:
            if self.gate_up.follows(self.gate_proj, self.up_proj):  # one GEMM, [..., 2I] = gate then up, in place
                w, _ = self.gate_up.weights()
                return self.down_proj(triton_kernels.swiglu(F.linear(x, w), backend="triton"))
            act = triton_kernels.swiglu(self.gate_proj(x), self.up_proj(x), backend="triton")  # (see Attention)
            return self.down_proj(act)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, cache_kv, cache, attn_mask, hook, layer_idx, live_lens=None):
        h = self.input_layernorm(x)
        a, k, v = self.self_attn(h, cos, sin, cache_kv, cache, attn_mask, hook, layer_idx, live_lens)
        x = x + a
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, k, v

    def forward_fused(self, x, delta, cos, sin, cache_kv, cache, attn_mask, hook, layer_idx, live_lens=None):
        """The fused path: the residual stream is ``x + delta`` (``delta`` = the previous layer's MLP
        output, added here by the norm kernel; None for the first layer). Returns ``(x, delta, k, v)``:
        the residual before this layer's MLP output and that output, whose sum is :meth:`forward`'s x."""
        norm = self.input_layernorm
        h, s = triton_kernels.add_rms_norm(x, norm.weight, norm.eps, delta, backend="triton")
        x = x if s is None else s
        a, k, v = self.self_attn(h, cos, sin, cache_kv, cache, attn_mask, hook, layer_idx, live_lens, fused=True)
        norm = self.post_attention_layernorm
        h, x = triton_kernels.add_rms_norm(a, norm.weight, norm.eps, x, backend="triton")  # x + a, then its norm
        return x, self.mlp(h, fused=True), k, v


@dataclass
class DecoderOutput:
    """Result of :meth:`DiffusionLM.forward`.

    Attributes:
        logits: ``[B, L - logits_start, V]`` in the model dtype; ``logits[:, j]`` is the
            distribution of live token ``logits_start + j`` (already shifted for Dream).
            None when ``logits_start == L``.
        k, v: per layer ``[B, L, Hkv, D]`` live keys (RoPE applied) and values, when
            ``return_kv`` was set; else None.
    """

    logits: torch.Tensor | None
    k: list | None = None
    v: list | None = None


def _check_ids_and_positions(input_ids: torch.Tensor, position_ids: torch.Tensor):
    """``(B, L, position_ids [B, L])`` for ``input_ids [B, L]`` and positions ``[B, L]`` or ``[L]`` (broadcast
    over the rows). Raises ValueError: ids not 2-D, positions of another shape."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [B, L], got shape {tuple(input_ids.shape)}")
    b, n = input_ids.shape
    if position_ids.dim() == 1:
        position_ids = position_ids.unsqueeze(0).expand(b, n)
    if tuple(position_ids.shape) != (b, n):
        raise ValueError(f"position_ids {tuple(position_ids.shape)} does not match input_ids {(b, n)}")
    return b, n, position_ids


class DiffusionLM(nn.Module):
    """Bidirectional decoder of a diffusion LM (Dream or LLaDA family).

    Attributes set by :func:`dllm.load_model`: ``tokenizer`` (or None) and
    ``model_dir``. ``family``, ``mask_token_id`` and ``shift_logits`` come from
    the config; ``rope`` (:class:`~dllm.model.rope.RotaryEmbedding`) holds the RoPE
    frequencies, also used to re-position cached chunk keys (``model.rope.rotate_keys``).
    ``fused_ops`` (None = auto, True, False) chooses the fused elementwise Triton path
    (:meth:`uses_fused_ops`, the module docstring).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        # RoPE frequencies (plain or a static scaling variant): the config's own table, computed once when
        # the config was validated; not a buffer, so building under a meta device (dllm.load_model) leaves
        # them real.
        self.rope = RotaryEmbedding.from_config(cfg)
        self.tokenizer = None
        self.model_dir = None
        self.fused_ops: bool | None = None  # None = auto (see uses_fused_ops)

    # --- identity -----------------------------------------------------------------
    @property
    def family(self) -> str:
        """``"dream"`` or ``"llada"`` (from the checkpoint's ``config.json``)."""
        return self.config.family

    @property
    def mask_token_id(self) -> int:
        """Id of the mask token that fills the response before it is unmasked."""
        return self.config.mask_token_id

    @property
    def shift_logits(self) -> bool:
        """True where position i predicts token i + 1 (Dream, adapted from an AR model), False where it predicts
        token i (LLaDA)."""
        return self.config.shift_logits

    @property
    def device(self) -> torch.device:
        """Device of the weights."""
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """Floating dtype of the weights."""
        return self.embed_tokens.weight.dtype

    def uses_fused_ops(self, device: torch.device | None = None) -> bool:
        """Whether a forward on ``device`` (default: the weights') runs the fused elementwise Triton kernels.

        ``self.fused_ops``: ``True`` / ``False`` force the choice; ``None`` (the default) = auto: on for a
        CUDA device whose ops dispatch to Triton (:func:`triton_kernels._dispatch.resolve_backend`),
        unless the environment variable ``PREFILLING_DLLM_FUSED`` is ``0`` / ``false`` / ``no``, and off
        for a training forward (gradients enabled and a parameter that requires them): the Triton kernels
        have no backward, so their outputs would cut the autograd graph. Forcing ``True`` on CPU needs the
        Triton interpreter (``TRITON_INTERPRET=1`` before the first import).
        """
        if self.fused_ops is not None:
            return bool(self.fused_ops)
        device = self.device if device is None else device
        if device.type != "cuda" or resolve_backend(None, device) != "triton":
            return False
        if torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters()):
            return False
        return os.environ.get(FUSED_ENV, "1").strip().lower() not in ("0", "false", "no")

    def merge_projections(self) -> None:
        """Lay out every layer's q/k/v weights (and biases) as one ``[(Hq + 2 Hkv) D, H]`` tensor and its
        gate/up weights as one ``[2 I, H]`` tensor, the fused path's two GEMMs (:mod:`dllm.model.merged_linear`).

        The parameters keep their names and shapes (they become views of the merged tensors), so the
        ``state_dict``, checkpoint loading and the torch path are unchanged, and the weights take no extra
        memory. The fused path merges on its first forward anyway; calling this first (as
        :func:`dllm.load_model` does when the fused path is on) keeps that out of a CUDA graph capture and
        lets the CUDA allocator return the separate blocks (``torch.cuda.empty_cache``) at once.
        Idempotent; a move or cast of the model keeps the layout.

        Raises:
            RuntimeError: called inside a CUDA graph capture.
        """
        for layer in self.layers:
            layer.self_attn.qkv.weights()
            layer.mlp.gate_up.weights()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # the separate matrices' blocks, freed by the merge

    @torch.no_grad()
    def layer_keys(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, layer: int, *, attention_mask=None
    ) -> torch.Tensor:
        """The keys of one layer, at the cost of the layers before it: ``forward(..., return_kv=True).k[layer]``
        without the rest of the model (layers ``0 .. layer-1`` run in full, of ``layer`` only its input norm and K
        projection). Layer 0's keys are a projection of the token embeddings: nearly free. Used by the first
        stage of a fresh context (:func:`dllm.prefilling.chunks.encode_candidates`); our extension.

        Args:
            input_ids: ``[B, L]`` int64.
            position_ids: ``[B, L]`` or ``[L]`` int64 RoPE positions.
            layer: 0 <= layer < num_layers (negative counts from the last).
            attention_mask: None or ``[B, L]`` bool (True = a valid key), as :meth:`forward`'s.

        Returns:
            ``[B, L, Hkv, D]`` keys, RoPE applied, in the model dtype.

        Raises:
            ValueError: ``layer`` outside the model's layers, ids not ``[B, L]``, a mask or positions of
                another shape.
        """
        n_layers = len(self.layers)
        if not -n_layers <= layer < n_layers:
            raise ValueError(f"layer={layer} is outside the model's {n_layers} layers")
        layer %= n_layers
        b, n, position_ids = _check_ids_and_positions(input_ids, position_ids)
        mask = None
        if attention_mask is not None:
            if attention_mask.dtype != torch.bool or tuple(attention_mask.shape) != (b, n):
                raise ValueError(f"attention_mask must be [B, L] = {(b, n)} bool, got {tuple(attention_mask.shape)}")
            mask = attention_mask[:, None, None, :]
        cos, sin = self.rope.cos_sin(position_ids)
        x = self.embed_tokens(input_ids)
        for i in range(layer):
            x, _k, _v = self.layers[i](x, cos, sin, None, None, mask, None, i)
        attn = self.layers[layer].self_attn
        h = self.layers[layer].input_layernorm(x)
        return apply_rope(attn.k_proj(h).view(b, n, attn.hkv, attn.d), cos, sin)  # as Attention.forward's k

    # --- forward ------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cache: StaticKVCache | None = None,
        *,
        attention_mask: torch.Tensor | None = None,
        live_lens: torch.Tensor | None = None,
        logits_start: int = 0,
        logits_at: torch.Tensor | None = None,
        rope: tuple | None = None,
        return_kv: bool = False,
        attn_hook=None,
    ) -> DecoderOutput:
        """Run the live tokens through the model.

        Args:
            input_ids: ``[B, L]`` int64 token ids of the live tokens.
            position_ids: ``[B, L]`` or ``[L]`` int64 RoPE positions (explicit: cached
                segments and live tokens need not be contiguous).
            cache: static KV of segments the live tokens also attend to (every layer);
                its ``seg_slots`` must have B rows. None = attention over live tokens only.
            attention_mask: only without a cache. ``[B, L]`` bool (True = key is valid, e.g.
                padding of a ragged batch) or ``[B, L, L]`` bool (query x key allowed).
            live_lens: ``[B]`` int32/int64, real live tokens per row of a ragged batch padded to L
                (each in ``0..L``; None = all L). Row b's tokens past ``live_lens[b]`` are padding:
                no query sees them as keys, and their own outputs are meaningless. With a cache it
                goes to ``split_s_attention``'s ``live_lens``; without one it becomes a key mask
                (then no ``attention_mask`` may be given). Its values are checked on every call
                unless inside :func:`triton_kernels.skip_value_checks` (one host sync on CUDA).
            logits_start: first live position whose logits are returned; earlier ones skip
                the LM head (saves the ``V``-wide matmul for a long prompt).
            logits_at: ``[B, K]`` int64 live columns whose logits are returned, per row (a ragged
                batch whose response sits at other columns in each row); overrides ``logits_start``,
                which must then stay 0.
            rope: precomputed ``(cos, sin)`` float32 ``[B, L, D]`` of ``position_ids``
                (``self.rope.cos_sin(position_ids)``, computed once per generation by a decode
                policy); None = computed here.
            return_kv: also return every layer's live K (RoPE applied) and V.
            attn_hook: optional ``fn(layer_idx, q, k, v)`` called in every layer with the live
                q ``[B, L, Hq, D]``, k/v ``[B, L, Hkv, D]`` (used by chunk scoring).

        Returns:
            :class:`DecoderOutput`. For shifted (Dream) models the logits of token i are the
            head output at position i-1; token 0 uses its own position (Dream's convention).
            With ``logits_at`` the logits are ``[B, K, V]``, entry ``[b, j]`` for column ``logits_at[b, j]``.

        Raises:
            ValueError: shape mismatches, a mask together with a cache or with ``live_lens``, a
                cache with the wrong number of layers / batch rows, ``live_lens`` out of range,
                ``logits_at`` together with ``logits_start``, rope tables of the wrong shape.
        """
        b, n, position_ids = _check_ids_and_positions(input_ids, position_ids)
        if not 0 <= logits_start <= n:
            raise ValueError(f"logits_start {logits_start} outside [0, {n}]")
        if logits_at is not None:
            if logits_start:
                raise ValueError("pass logits_at or logits_start, not both")
            if logits_at.dim() != 2 or logits_at.shape[0] != b:
                raise ValueError(f"logits_at must be [B={b}, K], got shape {tuple(logits_at.shape)}")
        if live_lens is not None:
            if live_lens.shape != (b,) or live_lens.dtype not in (torch.int32, torch.int64):
                raise ValueError(
                    f"live_lens must be a [B={b}] int32/int64 tensor, got {live_lens.dtype} {tuple(live_lens.shape)}"
                )
            if attention_mask is not None:
                raise ValueError("live_lens cannot be combined with attention_mask")
            if check_values_enabled() and live_lens.numel() and bool(((live_lens < 0) | (live_lens > n)).any()):
                raise ValueError(f"live_lens must be in [0, L={n}], got {live_lens.tolist()}")
        mask = None
        if cache is not None:
            if attention_mask is not None:
                raise ValueError("attention_mask cannot be combined with a static cache")
            if cache.num_layers != len(self.layers) or cache.batch_size != b:
                raise ValueError(
                    f"cache has {cache.num_layers} layers x {cache.batch_size} rows; "
                    f"model has {len(self.layers)} layers, batch is {b}"
                )
        elif live_lens is not None:
            mask = (torch.arange(n, device=input_ids.device)[None, :] < live_lens[:, None])[:, None, None, :]
        elif attention_mask is not None:
            if attention_mask.dtype != torch.bool:
                raise ValueError(f"attention_mask must be bool, got {attention_mask.dtype}")
            if attention_mask.shape == (b, n):
                mask = attention_mask[:, None, None, :]
            elif attention_mask.shape == (b, n, n):
                mask = attention_mask[:, None]
            else:
                raise ValueError(f"attention_mask must be [B, L] or [B, L, L], got {tuple(attention_mask.shape)}")

        cfg = self.config
        if rope is None:
            cos, sin = self.rope.cos_sin(position_ids)  # [B, L, D] fp32, YaRN's attention factor included
        else:
            cos, sin = rope
            if tuple(cos.shape) != (b, n, cfg.head_dim) or tuple(sin.shape) != (b, n, cfg.head_dim):
                raise ValueError(f"rope tables must be [B, L, D] = {(b, n, cfg.head_dim)}, got {tuple(cos.shape)}")
        x = self.embed_tokens(input_ids)
        ks, vs = [], []
        cache_lens = live_lens if cache is not None else None
        fused = self.uses_fused_ops(x.device)
        delta = None  # fused path: the last MLP output, not yet added to the residual stream x
        # the cache's segment table was range-checked when it was built: skip the per-call host sync
        with triton_kernels.skip_value_checks():
            for i, layer in enumerate(self.layers):
                cache_kv = (cache.k[i], cache.v[i]) if cache is not None else None
                if fused:
                    x, delta, k, v = layer.forward_fused(
                        x, delta, cos, sin, cache_kv, cache, mask, attn_hook, i, cache_lens
                    )
                else:
                    x, k, v = layer(x, cos, sin, cache_kv, cache, mask, attn_hook, i, cache_lens)
                if return_kv:  # the fused path's v is a view of the whole q/k/v output: keep v's bytes only
                    ks.append(k)
                    vs.append(v.contiguous())
        logits = None
        rows = _logit_rows(x, n, logits_start, logits_at, cfg.shift_logits)  # the LM head's rows only
        if rows is not None:
            if fused:  # the last residual add, on those rows only, fused into the final norm
                last = rows(delta) if delta is not None else None
                h, _ = triton_kernels.add_rms_norm(rows(x), self.norm.weight, self.norm.eps, last, backend="triton")
            else:
                h = self.norm(rows(x))
            logits = self.lm_head(h)
        return DecoderOutput(logits, ks if return_kv else None, vs if return_kv else None)


def _logit_rows(x: torch.Tensor, n: int, logits_start: int, logits_at, shift: bool):
    """A function selecting, from a ``[B, L, H]`` hidden state, the rows whose logits are returned
    (``logits_at`` per row, or columns ``logits_start..L-1``; one position earlier for a shifted model),
    or None when no logits are asked for."""
    if logits_at is not None:
        src = (logits_at - 1).clamp_min(0) if shift else logits_at  # [B, K]
        return lambda t: t.gather(1, src[..., None].expand(-1, -1, t.shape[-1]))
    if logits_start >= n:
        return None
    if shift:
        src = torch.arange(logits_start - 1, n - 1, device=x.device).clamp_min(0)
        return lambda t: t.index_select(1, src)
    return lambda t: t[:, logits_start:]
