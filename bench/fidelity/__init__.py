"""Fidelity room: does the answer survive the selection? Passkey and needle retrieval against dense and
prefix-cache decoding (demo, lost in the middle, long contexts) and needle-chunk recall on held-out documents.
One line per module in ``bench/README.md``."""
