"""Studies room: the one-off studies that chose the bundled model's defaults (chunk size and K, score terms,
lexical weight, adaptive K, the first stage, boundary snapping, scale by default), kept so that each choice can be
rerun. The defaults themselves live in :mod:`bench.tiny_defaults`. One line per module in ``bench/README.md``."""
