"""Numeric constants of the kernels, one name each.

They are ``tl.constexpr`` so that jitted code may read them as module globals;
host code reads ``.value``. Kernels work in base 2 (``exp2``/``log2``): the
softmax scale is folded into the logits as ``sm_scale * LOG2E`` and every LSE
leaves a kernel in natural log (``* LN2``).
"""

import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # log2(e)
LN2 = tl.constexpr(0.6931471805599453)  # ln(2)
