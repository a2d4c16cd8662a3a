"""Kernel room: the microbenchmarks of ``triton_kernels`` against FlexAttention and SDPA, their roofline, and the
checks that a GPU run is ready (AOT compile gate, direct launch path, host time, launch counts, CUDA-graph step).
One line per module in ``bench/README.md``."""
