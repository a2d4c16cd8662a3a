#!/usr/bin/env bash
# GPU check for triton_kernels: compiled kernel tests, then the kernel microbenchmarks.
#
#   bash bench/gpu_check.sh OUT_DIR
#
# Meant for a GPU machine with Python 3.12, torch 2.11 and Triton 3.6 preinstalled
# and NO package registry: nothing is installed, modules run from the checkout with
# PYTHONPATH=. and python3 (override with PYTHON=...). Budget: under 8 minutes.
# Every stage has its own timeout; a failing stage does not stop the next one; exit
# codes and durations go to OUT_DIR/summary.txt and the script exits non-zero if
# any stage failed. Without a GPU it still runs (tests through the Triton
# interpreter, CPU benchmark): that is the dry run.
set -u
set -o pipefail

OUT_DIR="${1:?usage: bench/gpu_check.sh OUT_DIR}"
PYTHON="${PYTHON:-python3}"
TEST_TIMEOUT_S="${TEST_TIMEOUT_S:-240}"
BENCH_TIMEOUT_S="${BENCH_TIMEOUT_S:-200}"
BENCH_BUDGET_S="${BENCH_BUDGET_S:-130}"   # bench stops starting new cases after this

mkdir -p "$OUT_DIR" || exit 2
OUT_DIR="$(cd "$OUT_DIR" && pwd)"   # absolute, relative to the caller's directory
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export TRITON_DEFAULT_FP_FUSION="${TRITON_DEFAULT_FP_FUSION:-1}"
unset TRITON_INTERPRET            # compiled kernels on the GPU (conftest sets it only without CUDA)
SUMMARY="$OUT_DIR/summary.txt"
: > "$SUMMARY"
FAILED=0

log() { echo "[gpu_check $(date -u +%H:%M:%S)] $*" | tee -a "$SUMMARY"; }

stage() {  # stage NAME TIMEOUT_S LOGFILE CMD...
    local name="$1" limit="$2" logfile="$3"
    shift 3
    log "stage $name: start (timeout ${limit}s): $*"
    local t0=$SECONDS
    timeout --signal=TERM --kill-after=15 "$limit" "$@" > "$logfile" 2>&1
    local rc=$?
    local dt=$((SECONDS - t0))
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        log "stage $name: TIMEOUT after ${dt}s (rc=$rc), log $logfile"
    else
        log "stage $name: rc=$rc in ${dt}s, log $logfile"
    fi
    [ "$rc" -ne 0 ] && FAILED=1
    tail -n 25 "$logfile" | sed "s/^/    [$name] /"
    return 0
}

# Stage 0: where are we (never fails the run).
{
    echo "date_utc: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
    command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    "$PYTHON" - <<'PY' 2>&1
import sys
print("python", sys.version.split()[0])
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
    if torch.cuda.is_available():
        print("device", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability())
except Exception as exc:
    print("torch import failed:", exc)
try:
    import triton
    print("triton", triton.__version__)
except Exception as exc:
    print("triton import failed:", exc)
try:
    import pytest
    print("pytest", pytest.__version__)
except Exception as exc:
    print("pytest import failed:", exc)
PY
} > "$OUT_DIR/env.txt" 2>&1
sed 's/^/    [env] /' "$OUT_DIR/env.txt"

# Stage 1: kernel tests, compiled. addopts is overridden because pyproject's
# --benchmark-disable needs pytest-benchmark, which the GPU image may lack. The AOT compile
# gate (test_gpu_compile.py) is left to `make test`: here the kernels compile for the real GPU.
stage tests "$TEST_TIMEOUT_S" "$OUT_DIR/tests.log" \
    "$PYTHON" -m pytest tests/kernels -q -o addopts="-ra" -p no:cacheprovider \
    --ignore=tests/kernels/test_gpu_compile.py --junitxml="$OUT_DIR/tests.xml" --durations=15

# Stage 2: microbenchmarks (runs even if tests failed; it re-checks correctness itself). On a GPU
# each latency is also given as a percentage of the H200 lower bound of bench/roofline.py.
stage bench "$BENCH_TIMEOUT_S" "$OUT_DIR/bench.log" \
    "$PYTHON" -m bench.bench_kernels --out "$OUT_DIR" --budget-s "$BENCH_BUDGET_S"

# Stage 3: the model layer on the kernels: prefilling decode of the bundled model on CUDA (bf16),
# split-S attention, chunk scores and top-B gather all dispatched to Triton.
stage e2e "${E2E_TIMEOUT_S:-90}" "$OUT_DIR/e2e.log" \
    "$PYTHON" -m dllm eval passkey --lengths 8192 --depths 0 0.5 1 --samples 2 --method prefilling \
    --chunk-size 256 --top-k 4 --token-budget 128 --gen-length 8 --out "$OUT_DIR/e2e_prefilling_gpu.csv"

# Stage 4: the prefilling denoising step replayed from a CUDA graph vs run eagerly: the same tokens (bundled
# model, single prompts and a ragged batch; a Dream-7B-shaped random model over a random K = 4 x C = 1024
# cache) and the time per step both ways. Without a GPU it says why it skipped and succeeds (the dry run).
stage cuda_graph "${GRAPH_TIMEOUT_S:-180}" "$OUT_DIR/cuda_graph.log" \
    "$PYTHON" -m bench.cuda_graph_check --out "$OUT_DIR"

log "done: total ${SECONDS}s, failed=$FAILED; outputs in $OUT_DIR"
exit "$FAILED"
