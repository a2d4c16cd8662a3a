"""Test-wide setup. Runs before any test module imports triton_kernels.

Without CUDA the Triton kernels can only run through the Triton interpreter,
which reads TRITON_INTERPRET when ``@triton.jit`` decorates a kernel, i.e. at
import time; so it is set here, before the first kernel import.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
