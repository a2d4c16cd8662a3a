"""Where and when a result was measured: device, library versions, git commit, UTC date.

Every CSV that ``python -m dllm eval`` writes carries these columns, as the benchmarks' CSVs under
``bench/results`` do (:mod:`bench.provenance` builds on this module), so numbers from different machines,
versions and commits are never mixed up silently.
"""

from __future__ import annotations

import datetime as _dt
import functools
import os
import platform
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout holding dllm/, when run from one


def git_commit(root: Path = REPO_ROOT) -> str:
    """The short commit of the checkout at ``root`` (``-dirty`` with uncommitted changes outside
    ``bench/results``), else ``$GIT_COMMIT``, else ``"unknown"``. Never raises: an installed package (no
    ``.git`` beside it), a missing ``git`` or a slow one (10 s) give the fallback."""
    fallback = os.environ.get("GIT_COMMIT", "unknown")
    if not (Path(root) / ".git").exists():
        return fallback
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
        commit = out.stdout.strip()
        if out.returncode or not commit:
            return fallback
        # the recorded results are what a recording rewrites: they do not make the code "dirty"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/results"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return fallback


@functools.cache
def provenance(device: str | None = None) -> dict[str, str]:
    """``{device_name, device_kind, torch, triton, cuda, commit, date_utc}`` as strings, for ``device``
    (``"cpu"``, ``"cuda"``, ``"cuda:N"``; None: CUDA when available). Cached per process (one date per run)."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # pragma: no cover - triton is a hard dependency, but keep the writer usable
        triton_version = "none"
    use_cuda = torch.cuda.is_available() and (device is None or str(device).startswith("cuda"))
    if use_cuda:
        name = torch.cuda.get_device_name(torch.device(device) if device and ":" in str(device) else None)
        kind = "GPU"
    else:
        name = platform.processor() or platform.machine() or "cpu"
        kind = f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"
    return {
        "device_name": name,
        "device_kind": kind,
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": str(torch.version.cuda) if use_cuda else "none",
        "commit": git_commit(),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
