"""Packaging for prefilling-dllm (one distribution, two import packages).

`triton_kernels` holds the fused ops and their torch references; `dllm` holds
the model layer, decode loops, Prefilling-dLLM pipeline, tasks and CLI.
"""

from setuptools import find_packages, setup

LM_EVAL = "0.4.13"  # the lm-evaluation-harness release the harness extras pin

setup(
    name="prefilling-dllm",
    version="0.1.0",
    description=(
        "Triton kernels and a dLLM runtime for long-context diffusion LM inference "
        "(Prefilling-dLLM: chunked prefill, predictive chunk scoring, split-S attention)."
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["triton_kernels", "triton_kernels.*", "dllm", "dllm.*"]),
    package_data={"dllm": ["assets/*.txt", "assets/*/*", "assets/*/*/*", "eval/tasks/*.json", "eval/tasks/*.txt"]},
    include_package_data=True,
    install_requires=[
        # A range, not a pin: on a GPU machine the CUDA torch already there satisfies it.
        "torch>=2.6",
        "triton>=3.2",
        # The range CI tests: make test (newest allowed) and make test-compat (4.46.3, the oldest).
        "transformers>=4.46.3,<=5.24.0",
        "safetensors>=0.4",
        "tqdm>=4.60",
        "matplotlib>=3.7",
        "numpy>=1.24",
    ],
    extras_require={
        "dev": ["pytest>=8", "pytest-benchmark>=4", "pytest-xdist>=3", "ruff>=0.5"],
        # lm-evaluation-harness model prefilling-dllm (python -m dllm.harness; make test-harness)
        "harness": [f"lm-eval=={LM_EVAL}"],
        # the harness's LongBench tasks (longbench_*): lm-eval's own extra, jieba, fuzzywuzzy and rouge for their
        # metrics (python -m dllm eval longbench needs none of them)
        "longbench": [f"lm-eval[longbench]=={LM_EVAL}"],
    },
    entry_points={"console_scripts": ["dllm=dllm.cli:main"]},
)
