"""The figures the README quotes are the recorded ones: each table of "Results at a glance" and the kernel
table, row by row, against the record it links (``bench/results/*.md`` tables, ``bench_kernels_cpu.csv``).
A new record that changes a figure fails here until the README says the same (and the reverse)."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
RESULTS = ROOT / "bench" / "results"


def _tables(text: str) -> list[list[list[str]]]:
    """Every markdown table of ``text``, indented ones too: rows of cells (the header row first, the rule row
    dropped)."""
    tables, current = [], []
    for line in text.splitlines() + [""]:
        line = line.strip()  # a table inside a list item is indented
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                current.append(cells)
        elif current:
            tables.append(current)
            current = []
    return tables


def _readme_table(header_start: str, column: str | None = None) -> list[dict]:
    """The README table whose first header cell is ``header_start`` (and which has ``column``)."""
    for table in _tables(README):
        if table[0][0] == header_start and (column is None or column in table[0]):
            return [dict(zip(table[0], row, strict=True)) for row in table[1:]]
    raise AssertionError(f"the README lost its table headed {header_start!r}")


def _record_table(path: Path, header_start: str) -> list[dict]:
    for table in _tables(path.read_text(encoding="utf-8")):
        if table[0][0] == header_start:
            return [dict(zip(table[0], row, strict=True)) for row in table[1:]]
    raise AssertionError(f"{path} has no table headed {header_start!r}")


def _linked(section: str) -> Path:
    """The record a README paragraph starting with ``section`` links first."""
    at = README.index(section)
    link = re.search(r"\]\((bench/results/[^)]+\.md)\)", README[at : at + 600])
    assert link, f"the README paragraph {section!r} links no record"
    return ROOT / link[1]


def _bold(cell: str) -> str:
    return cell.replace("*", "").strip()


def test_speed_table_is_the_recorded_one():
    record = _record_table(_linked("**Speed vs context length**"), "tokens")
    by = {(r["tokens"], r["method"]): r for r in record}
    rows = _readme_table("context tokens", "prefilling s")
    assert [r["context tokens"] for r in rows] == sorted({r["tokens"] for r in record}, key=int)
    for row in rows:
        n = row["context tokens"]
        for method in ("prefilling", "prefix_cache", "dense"):
            want = by[(n, method)]["total s"]
            got = row[f"{method} s"]
            assert got == (want if want != "-" else "skipped"), (n, method, got, want)
        pre = by[(n, "prefilling")]
        measured = pre["speedup vs dense (measured)"]
        assert _bold(row["prefilling vs dense"]) == ("" if "skipped" in measured else measured), n
        assert row["FLOP model"] == pre["speedup (FLOP model)"], n
        correct = []
        for method in ("prefilling", "prefix_cache", "dense"):
            acc = by[(n, method)]["accuracy %"]
            correct.append("-" if acc == "-" else f"{round(int(acc) * 3 / 100)}/3")
        assert row["correct: prefilling / prefix_cache / dense"] == ", ".join(correct), n


def test_long_answer_table_is_the_recorded_one():
    record = {r["answer tokens"]: r for r in _record_table(_linked("**Long answers**"), "answer tokens")}
    for row in _readme_table("answer tokens"):
        rec = record[row["answer tokens"]]
        assert row["ms/step, off"] == rec["ms/step off"] and row["ms/step, block cache"] == rec["ms/step block"]
        assert _same(row["end to end, off"], rec["end-to-end s off"]), row
        assert _same(row["end to end, block cache"], rec["end-to-end s block"]), row
        assert _same(row["speedup"], rec["speedup end to end"]), row


def _same(shown: str, recorded: str) -> bool:
    """A README number (``7.7 s``, ``**6.9x**``) is the record's, rounded to the decimals the README shows."""
    a = re.search(r"[\d.]+", _bold(shown))[0]
    b = float(re.search(r"[\d.]+", recorded)[0])
    digits = len(a.split(".")[1]) if "." in a else 0
    return a == f"{b:.{digits}f}"


def test_demo_table_is_the_recorded_one():
    record = {
        (r["context tokens"], r["method"]): r
        for r in _record_table(_linked("**Accuracy vs context length**"), "context tokens")
    }  # noqa: E501
    rows = _readme_table("context tokens", "prefilling s / case (vs dense)")
    for row in rows:
        n = row["context tokens"]
        for method in ("prefilling", "prefix_cache", "dense"):
            acc = record[(n, method)]["passkey accuracy %"].split(" ")[0]
            assert row[method] == (f"{acc}%" if acc != "-" else "skipped"), (n, method)
        pre = record[(n, "prefilling")]
        speed = pre["speedup vs dense"]
        want = pre["s / case"] + (f" ({speed})" if speed.endswith("x") else "")
        assert row["prefilling s / case (vs dense)"] == want, n


BASELINES = {  # the kernel table's words for a baseline -> the method column of bench_kernels_cpu.csv
    "compiled FlexAttention": "flex_compiled",
    "SDPA on a pre-gathered copy": "sdpa_pregathered",
    "a plain `logsumexp` merge": "torch_logsumexp",
    "vectorised torch": "torch_vectorised",
    "torch sort + gather": "torch_gather",
}


def test_kernel_ratios_are_the_recorded_ones():
    """Each "A-Bx baseline" of the kernel table is the min-max of the baseline's time over ours in the CSV."""
    ratios: dict = {}
    with open(RESULTS / "bench_kernels_cpu.csv", newline="") as f:
        for r in csv.DictReader(f):
            if r["time_over_ours"]:
                ratios.setdefault((r["op"], r["method"]), []).append(float(r["time_over_ours"]))
    rows = _readme_table("op")
    assert len(rows) >= 5
    for row in rows:
        op = row["op"].strip("`")
        claims = re.findall(r"([\d.]+)(?:-([\d.]+))?x ([^;(]+)", row["CPU path vs a torch baseline (measured)"])
        assert claims, row
        for lo, hi, words in claims:
            method = BASELINES[words.strip()]
            got = ratios[(op, method)]
            digits = len(lo.split(".")[1]) if "." in lo else 0
            assert f"{min(got):.{digits}f}" == lo, (op, method, min(got))
            if hi:
                assert f"{max(got):.{len(hi.split('.')[1])}f}" == hi, (op, method, max(got))
            else:
                assert f"{max(got):.{digits}f}" == lo, (op, method, got)


@pytest.mark.parametrize(
    "section", ["**Speed vs context length**", "**Long answers**", "**Accuracy vs context length**"]
)
def test_each_figure_names_its_commit_and_machine(section):
    """The record a README table quotes holds the commit and the machine it was measured at."""
    text = _linked(section).read_text(encoding="utf-8")
    assert re.search(r"commit [0-9a-f]{7,}", text) and re.search(r"Machine: .*CPU|machine", text), section


def test_copy_table_is_the_recorded_one():
    """The README's copy table against the 200-case record's rows: cases kept, prefilling (b) and the crop (e)
    exact on them, and their gap with a 90% interval computed here from the per-case differences."""
    from bench.fidelity.copy_eval import read_rows

    rows_of = read_rows(str(RESULTS / "copy_eval_200" / "copy_eval.csv"))[0]
    rows = _readme_table("context tokens", "fact's chunk kept (of 200)")
    assert [r["context tokens"] for r in rows] == ["4096", "16384", "65536", "131072"]
    for row in rows:
        cases = [r for r in rows_of if r["length"] == row["context tokens"]]
        kept = [r for r in cases if r["kept"]]
        assert len(cases) == 200 and row["fact's chunk kept (of 200)"] == str(len(kept))
        b, e = ([int(r[f"{c}_correct"]) for r in kept] for c in "be")
        assert row["prefilling exact where kept"] == f"{100 * sum(b) / len(kept):.0f}%"
        assert row["dense 1K crop, same cases"] == f"{100 * sum(e) / len(kept):.0f}%"
        d = [x - y for x, y in zip(b, e, strict=True)]
        mean = sum(d) / len(d)
        se = (sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d)) ** 0.5
        want = f"{100 * mean:+.1f} ({100 * (mean - 1.645 * se):+.1f} to {100 * (mean + 1.645 * se):+.1f})"
        assert row["prefilling - crop, points (90% interval)"] == want
        assert mean - 1.645 * se > -0.05  # within 5 points of the crop, even at the interval's lower end


def test_multipart_recall_and_parts_right_are_the_recorded_ones():
    """The README's sentence on multi-part answers: the parts' chunks kept, re-selection on / off at each length,
    and the parts right, against the record it links."""
    section = "Answers with several parts far apart in the document"
    path = _linked(section)
    assert path.name == "multipart_eval.md"
    text = " ".join(README[README.index(section) : README.index(section) + 900].split())
    said = re.search(r"keeps the chunk of ([\d% /]+) of the parts at ([\dK /]+) against ([\d% /]+) for", text)
    assert said, text
    on, lengths, off = ([c.strip() for c in said[i].split("/")] for i in (1, 2, 3))
    rows = {r["context tokens"]: r for r in _record_table(path, "context tokens")}
    assert [f"{int(k[:-1]) * 1024}" for k in lengths] == list(rows)
    kept = [re.findall(r"(\d+)% \(", rows[n]["parts' chunks kept: off / on"]) for n in rows]
    assert [k[0] + "%" for k in kept] == off and [k[1] + "%" for k in kept] == on
    right = sum(int(m) for r in rows.values() for m in re.findall(r"\((\d+)/", r["parts right: off / on / crop"]))
    parts = sum(int(r["parts"]) for r in rows.values())
    assert f"({right}/{parts}," in text
