"""Weight-space interpolation of two checkpoints of the same model: ``(1 - alpha) * base + alpha * tuned``.

    python -m bench.tiny.interpolate --base dllm/assets/tiny-dream --tuned DIR --alpha 0.5 --out OUT

The method is WiSE-FT (Wortsman et al., "Robust fine-tuning of zero-shot models", CVPR 2022,
arXiv 2109.01903): a fine-tune and the weights it started from lie in one linear basin, and the weights
between them often keep what the fine-tune gained while losing less of what the start could do on data
the fine-tune did not see. Here it weighs a reader fine-tune (``bench.tiny.curriculum`` phase 14:
copying among number-dense chunks) against the bundled weights on held-out prose.

``OUT`` gets every file of ``--tuned`` but its weights (config, tokenizer, prefilling config), the
interpolated ``model.safetensors`` (fp32) and ``interpolation.json`` (alpha and both inputs' sha256).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save_file

WEIGHTS = "model.safetensors"


def interpolate_state(base: dict, tuned: dict, alpha: float) -> dict:
    """``(1 - alpha) * base + alpha * tuned`` tensor by tensor, computed in fp32 (WiSE-FT, arXiv 2109.01903).

    base, tuned: name -> floating tensor, the same names and shapes (any float dtype; the result is fp32).
    alpha: in [0, 1]; 0 gives ``base``, 1 gives ``tuned``.
    Raises ValueError on alpha outside [0, 1] (or NaN), different tensor names, a shape mismatch or a
    non-floating tensor.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if set(base) != set(tuned):
        only = sorted(set(base) ^ set(tuned))
        raise ValueError(f"the checkpoints hold different tensors: {only[:5]}{' ...' if len(only) > 5 else ''}")
    out = {}
    for name in sorted(base):
        a, b = base[name], tuned[name]
        if a.shape != b.shape:
            raise ValueError(f"{name}: shape {tuple(a.shape)} in base, {tuple(b.shape)} in tuned")
        if not (a.is_floating_point() and b.is_floating_point()):
            raise ValueError(f"{name}: not a floating tensor ({a.dtype}, {b.dtype})")
        out[name] = torch.lerp(a.float(), b.float(), alpha).contiguous()
    return out


def _parse(raw: bytes, path: str) -> dict:
    try:
        return load(raw)
    except SafetensorError as e:  # a truncated or foreign file: say which one, as a ValueError the CLI reports
        raise ValueError(f"{path} is not a readable safetensors file ({e})") from e


def write_interpolated(base_dir: str, tuned_dir: str, alpha: float, out_dir: str) -> str:
    """Write the interpolated checkpoint into ``out_dir`` (made if missing; must not be either input).

    Returns the path of the written ``model.safetensors``. Raises ValueError as
    :func:`interpolate_state`, when ``out_dir`` is an input folder or an input's ``model.safetensors`` does
    not parse; FileNotFoundError when an input has no ``model.safetensors``.
    """
    paths = [os.path.join(d, WEIGHTS) for d in (base_dir, tuned_dir)]
    for p in paths:
        if not os.path.isfile(p):
            raise FileNotFoundError(f"no {WEIGHTS} in {os.path.dirname(p) or '.'}")
    if os.path.abspath(out_dir) in {os.path.abspath(base_dir), os.path.abspath(tuned_dir)}:
        raise ValueError("--out must be a new folder, not one of the inputs")
    base, tuned = (Path(p).read_bytes() for p in paths)  # read once: parsed and hashed from the same bytes
    state = interpolate_state(_parse(base, paths[0]), _parse(tuned, paths[1]), alpha)
    os.makedirs(out_dir, exist_ok=True)
    for name in os.listdir(tuned_dir):
        src = os.path.join(tuned_dir, name)
        if name != WEIGHTS and os.path.isfile(src):
            shutil.copyfile(src, os.path.join(out_dir, name))
    out = os.path.join(out_dir, WEIGHTS)
    save_file(state, out)
    record = {"method": "WiSE-FT, arXiv 2109.01903", "alpha": alpha}
    record |= {"base": base_dir, "base_sha256": hashlib.sha256(base).hexdigest()}
    record |= {"tuned": tuned_dir, "tuned_sha256": hashlib.sha256(tuned).hexdigest()}
    with open(os.path.join(out_dir, "interpolation.json"), "w") as f:
        json.dump(record, f, indent=2)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="python -m bench.tiny.interpolate")
    p.add_argument("--base", required=True, help="the checkpoint the fine-tune started from")
    p.add_argument("--tuned", required=True, help="the fine-tuned checkpoint (its config and tokenizer are copied)")
    p.add_argument("--alpha", type=float, required=True, help="weight of --tuned, in [0, 1]")
    p.add_argument("--out", required=True, help="a new folder for the interpolated checkpoint")
    args = p.parse_args(argv)
    try:
        path = write_interpolated(args.base, args.tuned, args.alpha, args.out)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
