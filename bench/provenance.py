"""Provenance fields carried by every benchmark CSV row, and the CSV writer.

Each row says where and when it was measured (device name,
torch/triton versions, git commit, UTC date), so numbers from different
machines and commits are never mixed up silently.
"""

from __future__ import annotations

import csv
from pathlib import Path

from dllm.eval.evaluation import one_line_cell
from dllm.eval.provenance import REPO_ROOT, provenance  # noqa: F401  (the columns dllm eval writes too)
from dllm.eval.provenance import git_commit as _git_commit  # noqa: F401


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
    are empty; text cells are on one line (:func:`dllm.eval.evaluation.one_line_cell`: a backslash, CR and LF
    written as ``\\``, ``\r``, ``\n``), so every row is one line of the file. Returns the path; raises
    ``OSError`` if it cannot be written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prov = provenance(device)
    full = [{k: one_line_cell(v) for k, v in {**prov, **row}.items()} for row in rows]
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


def read_csv(path) -> tuple[list[dict], str]:
    """The rows of a CSV that :func:`write_csv` wrote (cells as text) and its first row's "Machine: ..." line
    (empty without rows). Raises ``OSError`` if it cannot be read."""
    with Path(path).open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        return rows, ""
    r = rows[0]
    machine = (f"Machine: {r['device_kind']} {r['device_name']}; torch {r['torch']}, triton {r['triton']}; "
               f"commit {r['commit']}; {r['date_utc']}")  # fmt: skip
    return rows, machine
