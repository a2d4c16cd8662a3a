"""``python -m dllm.harness``: see :mod:`dllm.harness.cli`."""

import sys

from dllm.harness.cli import main

sys.exit(main())
