"""Provenance fields carried by every benchmark CSV row, and the CSV writer.

Each row says where and when it was measured (device name,
torch/triton versions, git commit, UTC date), so numbers from different
machines and commits are never mixed up silently.
"""

from __future__ import annotations

import csv
import datetime as _dt
import functools
import os
import platform
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
        commit = out.stdout.strip() or "unknown"
        # the recorded results are what a recording rewrites: they do not make the code "dirty"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/results"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("GIT_COMMIT", "unknown")


@functools.cache
def provenance(device: str | None = None) -> dict[str, str]:
    """``{device_name, device_kind, torch, triton, cuda, commit, date_utc, host_cpu}`` as strings."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # pragma: no cover - triton is a hard dependency, but keep the writer usable
        triton_version = "none"
    use_cuda = torch.cuda.is_available() and (device is None or str(device).startswith("cuda"))
    if use_cuda:
        name = torch.cuda.get_device_name()
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
        "commit": _git_commit(),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def machine_line(device: str | None = None) -> str:
    """The "Machine: ..." line every recorded Markdown result carries (device, versions, commit, UTC date)."""
    p = provenance(device)
    return (
        f"Machine: {p['device_kind']} {p['device_name']}; torch {p['torch']}, triton {p['triton']}; "
        f"commit {p['commit']}; {p['date_utc']}"
    )


def write_csv(path, rows: list[dict], device: str | None = None) -> Path:
    """Write ``rows`` (dicts) to ``path`` with the provenance columns (:func:`provenance` of ``device``)
    prepended to every row. Columns are the union of all row keys in first-seen order; missing cells
    are empty. Returns the path; raises ``OSError`` if it cannot be written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prov = provenance(device)
    full = [{**prov, **row} for row in rows]
    fields: list[str] = []
    for row in full:
        for key in row:
            if key not in fields:
                fields.append(key)
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(full)
    return path
