"""Speed room: end-to-end decoding time on the bundled tiny model and at Dream-7B's shape, beside the FLOP model
(context length, answer length, batching, document caches, chunk-parallel encoding, the decode step).
One line per module in ``bench/README.md``."""
