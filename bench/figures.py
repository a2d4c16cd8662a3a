"""Redraw the recorded figures from their CSVs, without running a benchmark.

    python -m bench.figures [--results bench/results]

redraws ``e2e_speed.png``, ``demo/demo.png``, ``chunk_tradeoff.png`` and ``lost_in_middle.png`` from the
CSVs beside them with the studies' own plot functions. The shared plot helpers live in
:mod:`bench.plotting`, which the studies import (so that this module can import them without a circle).
"""

from __future__ import annotations

import argparse
import os

from bench.fidelity import demo, lost_in_middle
from bench.plotting import read_csv_rows
from bench.speed import e2e_speed
from bench.studies import chunk_tradeoff


def redraw(results: str) -> list[str]:
    """Redraw the recorded figures under ``results`` from their CSVs; returns the paths written."""
    written = []
    csv_path = os.path.join(results, "e2e_speed.csv")
    if os.path.isfile(csv_path):
        e2e_speed.plot(read_csv_rows(csv_path), os.path.join(results, "e2e_speed.png"))
        written.append(os.path.join(results, "e2e_speed.png"))
    csv_path = os.path.join(results, "demo", "demo.csv")
    if os.path.isfile(csv_path):
        demo.plot_demo(read_csv_rows(csv_path), os.path.join(results, "demo", "demo.png"))
        written.append(os.path.join(results, "demo", "demo.png"))
    csv_path = os.path.join(results, "chunk_tradeoff.csv")
    if os.path.isfile(csv_path):
        rows = read_csv_rows(csv_path)
        d = chunk_tradeoff.DEFAULTS
        chunk_tradeoff.plot(
            rows, d["chunk_sizes"], d["top_k"], d["lengths"], os.path.join(results, "chunk_tradeoff.png")
        )
        written.append(os.path.join(results, "chunk_tradeoff.png"))
    csv_path = os.path.join(results, "lost_in_middle.csv")
    if os.path.isfile(csv_path):
        rows = read_csv_rows(csv_path)
        d = lost_in_middle.DEFAULTS
        depths = [i / (d["depths"] - 1) for i in range(d["depths"])]
        lost_in_middle.plot(rows, d["tasks"], d["lengths"], depths, os.path.join(results, "lost_in_middle.png"))
        written.append(os.path.join(results, "lost_in_middle.png"))
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=os.path.join(os.path.dirname(__file__), "results"))
    args = p.parse_args(argv)
    for path in redraw(args.results):
        print(f"wrote {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
