"""Pack a folder of run outputs into at most a handful of files (the GPU machine hands back 8 at most).

    python -m bench.pack_outputs WORK_DIR OUT_DIR

``bench/gpu_check.sh`` writes every stage's logs, CSVs and reports into a work folder and calls
this after every stage, so ``OUT_DIR`` always holds the run so far in a fixed set of names
(:data:`LAYOUT`), whatever stage the run is cut at:

* files matching a ``keep`` pattern are copied under their own name (one file per pattern: the
  benchmark CSV and the markdown reports a reader opens first);
* every other file goes into the first bundle whose patterns match it, or the last bundle,
  each file behind a ``==> name <==`` header line (as ``tail`` prints several files).

Empty bundles are not written. The layout has at most :data:`MAX_FILES` names, checked.
"""

from __future__ import annotations

import fnmatch
import shutil
import sys
from pathlib import Path

MAX_FILES = 8

# (name or None to keep the file's own, patterns); bundles in order, the last one takes the rest.
LAYOUT = {
    "keep": ["summary.txt", "bench_kernels_*.csv", "decode_step.md", "e2e_dream_shape.md"],
    "bundles": [
        ("tests.txt", ["tests.log", "tests.xml"]),
        ("logs.txt", ["*.log"]),
        ("reports.txt", ["*.md", "env.txt", "launch_check.txt"]),
        ("data.txt", ["*"]),
    ],
}


def plan_pack(names: list[str], layout: dict = LAYOUT) -> dict[str, list[str]]:
    """Which input files go to which output name: ``{output name: [input names, in order]}``.

    Raises:
        ValueError: the layout could produce more than :data:`MAX_FILES` files.
    """
    if len(layout["keep"]) + len(layout["bundles"]) > MAX_FILES:
        raise ValueError(f"pack layout names {len(layout['keep']) + len(layout['bundles'])} files > {MAX_FILES}")
    out: dict[str, list[str]] = {}
    left = sorted(names)
    for pattern in layout["keep"]:
        hit = next((n for n in left if fnmatch.fnmatch(n, pattern)), None)
        if hit is not None:
            out[hit] = [hit]
            left.remove(hit)
    bundles = layout["bundles"]
    for name in left:
        target = next((b for b, pats in bundles if any(fnmatch.fnmatch(name, p) for p in pats)), bundles[-1][0])
        out.setdefault(target, []).append(name)
    return out


def pack(work: Path, out: Path, layout: dict = LAYOUT) -> list[str]:
    """Write ``work``'s files into ``out`` by :func:`plan_pack`; returns the names written."""
    work, out = Path(work), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    names = [p.name for p in sorted(work.iterdir()) if p.is_file()]
    plan = plan_pack(names, layout)
    for target, sources in plan.items():
        if sources == [target]:
            shutil.copyfile(work / target, out / target)
            continue
        with open(out / target, "w", encoding="utf-8") as f:
            for src in sources:
                f.write(f"==> {src} <==\n")
                text = (work / src).read_text(encoding="utf-8", errors="replace")
                f.write(text if text.endswith("\n") or not text else text + "\n")
    return sorted(plan)


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not Path(args[0]).is_dir():
        print("error: usage: python -m bench.pack_outputs WORK_DIR OUT_DIR (WORK_DIR must exist)", file=sys.stderr)
        return 2
    written = pack(Path(args[0]), Path(args[1]))
    print(f"[pack_outputs] {len(written)} files in {args[1]}: {' '.join(written)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
