"""Checkpoint weights: safetensors files (single or sharded) and the per-family name maps.

Our module names follow the Qwen2 layout without the ``model.`` prefix
(``layers.N.self_attn.q_proj.weight``...). Dream checkpoints use the Qwen2 names
with the prefix; LLaDA checkpoints use OLMo names
(``model.transformer.blocks.N.attn_out.weight``...), mapped below. The exact
reference names are in ``tests/data/reference/*/weight_names.txt``.

A file that safetensors cannot read (empty, truncated by an interrupted download,
or not safetensors at all) raises :class:`WeightError` naming the file, never the
library's own ``SafetensorError``.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass

import torch
from safetensors import SafetensorError, safe_open

from .json_files import parse_json

# LLaDA (OLMo "llama" block) -> our names. ff_proj is the SwiGLU gate (activated),
# up_proj the linear branch, ff_out the down projection; the top-level ff_out is the LM head.
_LLADA_BLOCK = {
    "q_proj": "self_attn.q_proj",
    "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj",
    "attn_out": "self_attn.o_proj",
    "ff_proj": "mlp.gate_proj",
    "up_proj": "mlp.up_proj",
    "ff_out": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ff_norm": "post_attention_layernorm",
}
_LLADA_TOP = {
    "model.transformer.wte.weight": "embed_tokens.weight",
    "model.transformer.ln_f.weight": "norm.weight",
    "model.transformer.ff_out.weight": "lm_head.weight",
}
_LLADA_RE = re.compile(r"^model\.transformer\.blocks\.(\d+)\.(\w+)\.(weight|bias)$")
_DREAM_RE = re.compile(r"^model\.(.+)$")

# Buffers some exporters save that carry no learned state.
_IGNORED = re.compile(r"(rotary_emb\.inv_freq|\.rotary\.inv_freq)$")


class WeightError(ValueError):
    """Checkpoint weights are missing, unreadable, misnamed or of the wrong shape."""


@contextlib.contextmanager
def open_safetensors(path: str):
    """``safe_open(path)`` (torch framework) whose read errors become :class:`WeightError` naming ``path``.

    Covers the header (empty, truncated or foreign files fail when opened) and every tensor read
    inside the ``with`` block.

    Raises:
        WeightError: the file is empty or cannot be read as safetensors.
    """
    if os.path.isfile(path) and os.path.getsize(path) == 0:
        raise WeightError(f"{path}: the safetensors file is empty (0 bytes); re-download it")
    try:
        with safe_open(path, framework="pt") as f:
            yield f
    except (SafetensorError, OSError) as e:
        raise WeightError(
            f"{path}: not a readable safetensors file ({e}); it may be truncated or corrupt: re-download it"
        ) from e


def checkpoint_to_module_name(name: str, family: str) -> str | None:
    """Our parameter name for a checkpoint tensor name, or None for ignorable buffers.

    Raises:
        WeightError: a name that does not belong to the family's layout.
    """
    if _IGNORED.search(name):
        return None
    if family == "dream":
        if name == "lm_head.weight":
            return name
        m = _DREAM_RE.match(name)
        if m:
            return m.group(1)
    else:
        if name in _LLADA_TOP:
            return _LLADA_TOP[name]
        m = _LLADA_RE.match(name)
        if m and m.group(2) in _LLADA_BLOCK:
            return f"layers.{m.group(1)}.{_LLADA_BLOCK[m.group(2)]}.{m.group(3)}"
    raise WeightError(f"unexpected tensor {name!r} for a {family} checkpoint")


def module_to_checkpoint_name(name: str, family: str) -> str:
    """Inverse of :func:`checkpoint_to_module_name` (used to write checkpoints)."""
    if family == "dream":
        return name if name == "lm_head.weight" else f"model.{name}"
    for ck, ours in _LLADA_TOP.items():
        if ours == name:
            return ck
    m = re.match(r"^layers\.(\d+)\.(.+)\.(weight|bias)$", name)
    if m:
        for ck, ours in _LLADA_BLOCK.items():
            if ours == m.group(2):
                return f"model.transformer.blocks.{m.group(1)}.{ck}.{m.group(3)}"
    raise WeightError(f"no LLaDA name for parameter {name!r}")


def _read_index(index: str) -> dict[str, str]:
    """``weight_map`` of a safetensors index: tensor name -> shard file name."""
    with open(index, "rb") as f:
        weight_map = parse_json(f.read(), f"safetensors index {index}", WeightError).get("weight_map")
    if not isinstance(weight_map, dict):
        what = "no 'weight_map'" if weight_map is None else f"a 'weight_map' that is a {type(weight_map).__name__}"
        raise WeightError(f"{index} is not a valid safetensors index ({what}, not a mapping of tensor -> file)")
    bad = [
        f for f in weight_map.values() if not isinstance(f, str) or not f or os.path.isabs(f) or ".." in f.split("/")
    ]
    if bad:
        raise WeightError(f"{index} is not a valid safetensors index (shard names {bad[:3]!r} are not file names)")
    return weight_map


def checkpoint_files(model_dir: str) -> list[str]:
    """The safetensors files of a checkpoint.

    Uses ``model.safetensors.index.json`` (sharded) when present, else
    ``model.safetensors``, else any single ``*.safetensors`` file.

    Raises:
        WeightError: no safetensors file, an index that is not a JSON object with a ``weight_map``
            mapping, or an index naming a missing shard.
    """
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        files = sorted(set(_read_index(index).values()))
        missing = [f for f in files if not os.path.isfile(os.path.join(model_dir, f))]
        if missing:
            raise WeightError(f"{index} names shard(s) not in {model_dir}: {missing}")
        return [os.path.join(model_dir, f) for f in files]
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.isfile(single):
        return [single]
    found = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    if len(found) == 1:
        return [os.path.join(model_dir, found[0])]
    raise WeightError(f"{model_dir!r} has no model.safetensors or model.safetensors.index.json")


# safetensors dtype codes of floating-point tensors (weights must be one of them).
_FLOAT_CODES = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}


@dataclass(frozen=True)
class CheckpointTensor:
    """Where one parameter lives in a checkpoint (read from the safetensors headers, no data)."""

    file: str
    name: str
    shape: tuple[int, ...]
    dtype: str


def checkpoint_index(model_dir: str, family: str) -> dict[str, CheckpointTensor]:
    """Our parameter name -> its tensor in the checkpoint, from the safetensors headers only.

    Reads no tensor data, so a config can be checked against the checkpoint (layer count, shapes)
    before any memory is allocated for the model.

    Raises:
        WeightError: unreadable files or index (see :func:`checkpoint_files`), names outside the
            family's layout, a tensor stored in two shards (both named), or a weight that is not a
            floating-point tensor.
    """
    found: dict[str, CheckpointTensor] = {}
    for path in checkpoint_files(model_dir):
        with open_safetensors(path) as f:
            for ck_name in f.keys():
                name = checkpoint_to_module_name(ck_name, family)
                if name is None:
                    continue
                sl = f.get_slice(ck_name)
                entry = CheckpointTensor(path, ck_name, tuple(sl.get_shape()), sl.get_dtype())
                if name in found:
                    other = found[name]
                    raise WeightError(
                        f"tensor {ck_name!r} is stored twice: in {os.path.basename(other.file)} and in "
                        f"{os.path.basename(path)}"
                    )
                if entry.dtype not in _FLOAT_CODES:
                    raise WeightError(
                        f"{os.path.basename(path)}: tensor {ck_name!r} has dtype {entry.dtype}; weights must be "
                        "floating point"
                    )
                found[name] = entry
    return found


def checkpoint_num_layers(index: dict[str, CheckpointTensor]) -> int:
    """Decoder blocks a checkpoint holds: 1 + the largest ``layers.N`` index among its tensors (0 if none)."""
    layers = [int(m.group(1)) for n in index if (m := re.match(r"^layers\.(\d+)\.", n))]
    return max(layers) + 1 if layers else 0


def check_checkpoint_shapes(model: torch.nn.Module, index: dict[str, CheckpointTensor], model_dir: str) -> None:
    """Every parameter of ``model`` (may live on the meta device) is in ``index`` with its shape.

    Tied LM heads may be absent.

    Raises:
        WeightError: a checkpoint tensor with no parameter, a shape mismatch, missing parameters.
    """
    params = dict(model.named_parameters(remove_duplicate=False))
    tied = model.lm_head.weight is model.embed_tokens.weight
    for name, entry in index.items():
        if name not in params:
            where = os.path.basename(entry.file)
            raise WeightError(f"{where}: tensor {entry.name!r} maps to unknown parameter {name!r}")
        want = tuple(params[name].shape)
        if entry.shape != want:
            raise WeightError(f"shape mismatch for {entry.name!r}: checkpoint {entry.shape}, config expects {want}")
    missing = [n for n in params if n not in index and not (tied and n == "lm_head.weight")]
    if missing:
        more = f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""
        raise WeightError(f"checkpoint in {model_dir!r} lacks {len(missing)} tensor(s): {missing[:5]}{more}")


@torch.no_grad()
def load_weights_into(
    model: torch.nn.Module, model_dir: str, family: str, index: dict[str, CheckpointTensor] | None = None
) -> None:
    """Copy a checkpoint's tensors into ``model`` (converting to its dtype/device).

    Every parameter must be present exactly once with the expected shape; tied
    LM heads may be absent.

    Args:
        index: :func:`checkpoint_index` of ``model_dir`` when the caller already has it.

    Raises:
        WeightError: unexpected names, missing parameters, shape mismatches, duplicate or
            non-floating-point tensors, unreadable files.
    """
    index = checkpoint_index(model_dir, family) if index is None else index
    check_checkpoint_shapes(model, index, model_dir)
    params = dict(model.named_parameters(remove_duplicate=False))
    by_file: dict[str, list[tuple[str, str]]] = {}
    for name, entry in index.items():
        by_file.setdefault(entry.file, []).append((name, entry.name))
    for path, names in by_file.items():
        with open_safetensors(path) as f:
            for name, ck_name in names:
                p = params[name]
                p.copy_(f.get_tensor(ck_name).to(dtype=p.dtype, device=p.device))


def save_checkpoint(model: torch.nn.Module, model_dir: str, family: str, dtype: torch.dtype | None = None) -> None:
    """Write ``model``'s parameters as ``model.safetensors`` with the family's names."""
    from safetensors.torch import save_file

    os.makedirs(model_dir, exist_ok=True)
    tensors = {}
    for name, p in model.named_parameters():
        t = p.detach().to("cpu")
        t = (t if dtype is None else t.to(dtype)).contiguous()
        if t.untyped_storage().nbytes() != t.numel() * t.element_size():
            t = t.clone()  # a view of merged projections (dllm.model.merged_linear): safetensors wants its own memory
        tensors[module_to_checkpoint_name(name, family)] = t
    save_file(tensors, os.path.join(model_dir, "model.safetensors"), metadata={"format": "pt"})
