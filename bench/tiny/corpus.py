"""Pack the training sources into one compact token buffer that the GPU run reads (no registry there).

    python -m bench.tiny.corpus --out bench/tiny/corpus_build      # ~8 MB (24 M tokens), ~40 s on one core

Writes into ``--out`` (git-ignored; carried to the GPU machine with the working tree, 64 MiB at most):

- ``tokens.u8.gz``: the character ids of every training document back to back (uint8: the vocabulary has
  100 ids), gzip-compressed (~3x: the corpus and a resumable state must fit the 64 MiB the device tool carries),
- ``docs.npy``: int64 ``[n_docs, 3]`` rows of (first token, end token, source index),
- ``manifest.json``: the sources in index order with their documents and characters (0 for a source
  whose files are absent on this machine), the held-out sources (never read), the caps, and a SHA-256 of
  the tokens.

Only :data:`bench.tiny.sources.TRAINING_SOURCES` are read, and a training document that shares a run of 12
words with any held-out document is dropped (quotations of a held-out book, copied licence text); the
manifest counts the drops. The buffer is not committed (tens of MB): it is rebuilt here from what the
package managers installed (``apt-get install manpages manpages-dev fortunes dict-devil``; the Python
packages of ``make install``).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import sys

import numpy as np

from bench.tiny import sources
from bench.tiny.data import CHAR_ID, SPACE

# characters per source (the buffer stays well under the 64 MiB the device tool carries)
CAPS = {
    "manpages": 8_000_000,
    "python-comments": 5_000_000,
    "package-docs": 3_000_000,
    "debian-copyright": 2_000_000,
    "fortunes": 2_500_000,
    "reports": 6_000_000,
    "tables": 2_500_000,
}
_TABLE = bytes(CHAR_ID.get(chr(b), SPACE) for b in range(256))


def encode_fast(text: str) -> bytes:
    """Character ids of ``text`` (already in the tokenizer's characters) as bytes, one per character."""
    return text.encode("ascii", errors="replace").translate(_TABLE)


def build(out: str, caps: dict[str, int] | None = None, names: tuple[str, ...] | None = None) -> dict:
    """Read the training sources (``names``, default all of them) up to ``caps`` characters each and write
    tokens.u8.gz, docs.npy and manifest.json into ``out``; returns the manifest.

    Raises:
        ValueError: a held-out or unknown source among ``names``, or no document at all.
    """
    caps = dict(CAPS if caps is None else caps)
    names = sources.TRAINING_SOURCES if names is None else tuple(names)
    for n in names:
        if n not in sources.SOURCES or sources.SOURCES[n].held_out:
            raise ValueError(f"{n!r} is not a training source; training sources: {sources.TRAINING_SOURCES}")
    os.makedirs(out, exist_ok=True)
    held = sources.held_out_runs()  # a training document sharing a 12-word run with one of them is dropped
    chunks, rows, pos, listed = [], [], 0, []
    for index, name in enumerate(names):
        n_docs = n_chars = n_dropped = 0
        for _ident, text in sources.documents(name, caps.get(name)):
            if not held.isdisjoint(sources.word_runs(text)):
                n_dropped += 1
                continue
            ids = encode_fast(text)
            chunks.append(ids)
            rows.append((pos, pos + len(ids), index))
            pos += len(ids)
            n_docs, n_chars = n_docs + 1, n_chars + len(ids)
        src = sources.SOURCES[name]
        listed.append(
            {
                "name": name,
                "kind": src.kind,
                "package": src.package,
                "docs": n_docs,
                "chars": n_chars,
                "dropped_as_held_out_text": n_dropped,
            }
        )
        print(
            f"{name:18s} {n_docs:7d} documents {n_chars / 1e6:7.2f} M characters, {n_dropped} dropped", file=sys.stderr
        )
    if not rows:
        raise ValueError("no training document found: is any source installed?")
    blob = b"".join(chunks)
    with gzip.open(os.path.join(out, "tokens.u8.gz"), "wb", compresslevel=6) as f:
        f.write(blob)
    np.save(os.path.join(out, "docs.npy"), np.asarray(rows, dtype=np.int64))
    manifest = {
        "sources": listed,
        "held_out": list(sources.HELD_OUT_SOURCES),
        "held_out_runs": len(held),
        "caps": caps,
        "tokens": len(blob),
        "sha256": hashlib.sha256(blob).hexdigest(),
    }
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


class Corpus:
    """A packed corpus (:func:`build`'s folder) in memory: ``tokens`` uint8 [N], ``docs`` int64 [n, 3],
    ``names`` the sources in index order. Raises ``FileNotFoundError`` naming the build command."""

    def __init__(self, folder: str):
        path = os.path.join(folder, "manifest.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no corpus at {folder}: build it with python -m bench.tiny.corpus --out {folder}")
        with open(path) as f:
            self.manifest = json.load(f)
        with gzip.open(os.path.join(folder, "tokens.u8.gz"), "rb") as f:
            self.tokens = np.frombuffer(f.read(), dtype=np.uint8)
        self.docs = np.load(os.path.join(folder, "docs.npy"))
        self.names = [s["name"] for s in self.manifest["sources"]]
        if len(self.tokens) != self.manifest["tokens"]:
            raise ValueError(
                f"{folder}: tokens.u8.gz holds {len(self.tokens)} tokens, the manifest {self.manifest['tokens']}"
            )

    def source_docs(self, name: str) -> np.ndarray:
        """Rows of :attr:`docs` of source ``name`` (empty when it gave none)."""
        return self.docs[self.docs[:, 2] == self.names.index(name)] if name in self.names else self.docs[:0]


def main(argv=None) -> int:
    """Build the corpus; a bad --only is one ``error:`` line and exit code 2."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench/tiny/corpus_build")
    p.add_argument("--only", nargs="*", default=None, help="these training sources only")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every cap (a small corpus for tests)")
    args = p.parse_args(argv)
    try:
        m = build(args.out, {k: int(v * args.scale) for k, v in CAPS.items()}, args.only)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{m['tokens'] / 1e6:.2f} M tokens in {args.out}; held out: {', '.join(m['held_out'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
