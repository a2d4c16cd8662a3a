"""``python -m dllm``: see :mod:`dllm.cli`."""

import sys

from dllm.cli import main

sys.exit(main())
