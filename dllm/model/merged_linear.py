"""Merged projections: several ``nn.Linear`` over the same input as one GEMM, without a second copy of the weights.

A decoder layer projects its normed input three times for attention (q, k, v) and twice for the MLP (gate,
up). At decode shapes (tens of rows) each GEMM streams its weight once and is bound by that, and the small
ones (Dream-7B's k and v, 3.7 MB each) are bound by their launch instead: one GEMM over the concatenated
weight ``[q; k; v]`` (and one over ``[gate; up]``) reads the same bytes in fewer launches. This is what
inference engines do (vLLM's ``QKVParallelLinear`` / ``MergedColumnParallelLinear``); here the checkpoint
names stay as they are: :class:`MergedProjections` concatenates the weights once and then points every
``nn.Linear``'s parameters at their rows of the merged tensor (views), so ``state_dict``, weight loading
(``param.copy_``) and in-place edits see and change the merged tensor, and the weights take the same
memory as before.

Moving or casting the owning module (``.to``, ``.cuda``, ``.half``, ``to_empty``) gives every parameter its
own storage again; the owner's ``_apply`` calls :meth:`MergedProjections.after_apply`, which merges again.
Parameters replaced by any other route (``load_state_dict(assign=True)``, ``p.data = ...``) are seen by
:meth:`MergedProjections.weights` (it checks the addresses) and merged again at the next call. Modules replaced,
wrapped or hooked after the merge are seen by :meth:`MergedProjections.follows`: the owner then calls them.
"""

from __future__ import annotations

import torch
import torch.nn as nn


def _global_hooks_installed() -> bool:
    """Whether a forward hook is installed for every module (``nn.modules.module.register_module_forward_hook``
    and its pre-hook twin): a merged GEMM would skip it."""
    mod = nn.modules.module
    return bool(getattr(mod, "_global_forward_hooks", None) or getattr(mod, "_global_forward_pre_hooks", None))


class MergedProjections:
    """The merged weight (and bias) of ``linears``, concatenated along the output features in their order.

    Not an ``nn.Module``: it holds no parameters of its own (the linears keep theirs, as views), so a
    ``state_dict`` is unchanged. Used by :class:`dllm.model.modeling.Attention` (``[q; k; v]``) and
    :class:`dllm.model.modeling.MLP` (``[gate; up]``) on the fused path.
    """

    def __init__(self, *linears: nn.Linear):
        if not linears:
            raise ValueError("MergedProjections needs at least one nn.Linear")
        if len({lin.in_features for lin in linears}) != 1:
            raise ValueError(f"merged projections need one input width, got {[lin.in_features for lin in linears]}")
        if len({lin.bias is None for lin in linears}) != 1:
            raise ValueError("merged projections need a bias on every linear or on none")
        self._linears = linears
        self._weight: torch.Tensor | None = None
        self._bias: torch.Tensor | None = None

    @property
    def merged(self) -> bool:
        """Whether a merged tensor exists (it may be stale; :meth:`is_current` says)."""
        return self._weight is not None

    def _params(self, attr: str) -> list[torch.Tensor]:
        return [getattr(lin, attr) for lin in self._linears]

    @staticmethod
    def _views_of(merged: torch.Tensor | None, parts: list[torch.Tensor]) -> bool:
        """Whether ``parts`` are consecutive row blocks of ``merged`` (same device and dtype)."""
        if merged is None:
            return False
        addr, step = merged.data_ptr(), merged.element_size()
        for p in parts:
            if p.data_ptr() != addr or p.device != merged.device or p.dtype != merged.dtype:
                return False
            addr += p.numel() * step
        return True

    def is_current(self) -> bool:
        """Whether every linear's weight (and bias) is still a view of the merged tensor."""
        if not self._views_of(self._weight, self._params("weight")):
            return False
        return self._bias is None or self._views_of(self._bias, self._params("bias"))

    def follows(self, *modules: nn.Module) -> bool:
        """Whether one GEMM over the merged weights computes what calling ``modules`` (the owner's attributes
        now: ``attn.q_proj, attn.k_proj, attn.v_proj``) would: they are the very linears merged, each a plain
        ``nn.Linear`` (not a subclass: a quantised or LoRA layer computes something else), with no forward hook
        or pre-hook of their own and none installed globally. When not, the owner calls the modules themselves:
        a wrapper (peft's LoRA), a swapped-in layer or a hook put on after loading is never bypassed."""
        if len(modules) != len(self._linears) or _global_hooks_installed():
            return False
        return all(
            m is lin and type(m) is nn.Linear and not m._forward_hooks and not m._forward_pre_hooks
            for m, lin in zip(modules, self._linears)
        )

    def weights(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(weight [sum(out_features), in_features], bias [sum(out_features)] or None)``, merged on the
        first call (and again after the parameters were replaced).

        Raises:
            RuntimeError: the merge would run during a CUDA graph capture (its tensors would live in the
                graph's private memory pool): merge before capturing (a warm-up call, or
                :meth:`dllm.model.modeling.DiffusionLM.merge_projections`).
        """
        if not self.is_current():
            self.merge()
        return self._weight, self._bias

    @torch.no_grad()
    def merge(self) -> None:
        """Concatenate the linears' weights (and biases) into one tensor and make their parameters views of it.

        Peak memory: the merged tensor beside the separate ones, until they are freed here.

        Raises:
            RuntimeError: inside a CUDA graph capture (see :meth:`weights`); weights of different dtypes or
                devices.
        """
        ws = self._params("weight")
        if len({(w.dtype, w.device) for w in ws}) != 1:
            raise RuntimeError(f"merged projections need one dtype and device, got {[(w.dtype, w.device) for w in ws]}")
        if ws[0].is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "the q/k/v and gate/up projections are merged on first fused use, which cannot happen inside a "
                "CUDA graph capture: call model.merge_projections() (or run the step once) before capturing"
            )
        # a normal tensor even under inference_mode, so the parameters stay usable outside it
        with torch.inference_mode(False):
            self._weight = self._merge_into(ws)
            self._bias = None if self._linears[0].bias is None else self._merge_into(self._params("bias"))

    @staticmethod
    def _merge_into(parts: list[torch.Tensor]) -> torch.Tensor:
        merged = torch.cat([p.detach() for p in parts], dim=0)
        row = 0
        for p in parts:
            n = p.shape[0]
            p.data = merged[row : row + n]  # the Parameter object (and its name) stays; its memory is shared
            row += n
        return merged

    def release(self) -> None:
        """Forget the merged tensor (the parameters keep their memory, whatever it is)."""
        self._weight = self._bias = None


def apply_keeping_merged(module: nn.Module, groups: list[MergedProjections], fn, recurse: bool):
    """``nn.Module._apply`` for a module owning merged ``groups``: run it, then merge again every group that
    was merged before and whose parameters the conversion gave their own storage (a no-op conversion, such
    as ``.to()`` to the same device and dtype, leaves them views: nothing is copied). Holds one group's old
    storage until its new one is made. Returns the module."""
    was = [g.merged for g in groups]
    out = nn.Module._apply(module, fn, recurse)
    for g, merged in zip(groups, was):
        if merged and not g.is_current():
            g.release()
            g.merge()
    return out
