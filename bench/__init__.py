"""Benchmarks, studies and the training of the bundled tiny model (imports dllm, never the reverse)."""
