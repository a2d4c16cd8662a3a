#!/usr/bin/env bash
# GPU check: compiled kernel tests, the model on the kernels, the paper's headline at the Dream-7B
# shape, the CUDA-graph decode step vs eager, then the kernel microbenchmarks; one summary table at the end.
#
#   bash bench/gpu_check.sh OUT_DIR
#
# Meant for a GPU machine with Python 3.12, torch 2.11 and Triton 3.6 preinstalled and NO package
# registry: nothing is installed, modules run from the checkout with PYTHONPATH=. and python3
# (override with PYTHON=...). Budget: the whole script ends within DEADLINE_S (465 s: under 8
# minutes on an H200); every stage has its own timeout, capped by the time left, and the budgeted
# stages are given their share of it. A failing stage does not stop the next one; exit codes and
# durations go to OUT_DIR/summary.txt and the script exits non-zero if any stage failed or was
# skipped for lack of time.
#
# Dry run: without CUDA (or with DRY_RUN=1) every stage runs the same command at a small CPU
# configuration (a kernel-test file through the Triton interpreter, a seconds-long benchmark
# budget, a 1K-token passkey, the Dream-shaped run at its 2-layer `--shape cpu`), so the plumbing
# of every stage is checked in well under a minute; DRY_RUN=0 forces the real sizes.
#
# Adding a stage: one `stage NAME TIMEOUT_S LOGFILE CMD...` line (pick its GPU and dry-run sizes
# with `pick GPU_VALUE DRY_VALUE`); the bench stage runs last and takes whatever time is left.
set -u
set -o pipefail

OUT_DIR="${1:?usage: bench/gpu_check.sh OUT_DIR}"
PYTHON="${PYTHON:-python3}"

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
STAGE_ROWS=()

if [ -z "${DRY_RUN:-}" ]; then
    if "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2> /dev/null; then
        DRY_RUN=0
    else
        DRY_RUN=1
    fi
fi
pick() { if [ "$DRY_RUN" = 1 ]; then echo "$2"; else echo "$1"; fi; }  # pick GPU_VALUE DRY_RUN_VALUE

# On a small shared CPU an OpenMP team waiting for a descheduled thread makes torch ops up to 50x
# slower (the passkey stage once hit its timeout that way): the dry run uses one thread per process.
[ "$DRY_RUN" = 1 ] && export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

DEADLINE_S="${DEADLINE_S:-$(pick 465 900)}"   # whole script (the dry run is only bounded for safety)
MIN_STAGE_S=15                                # a stage with less time left than this is skipped

log() { echo "[gpu_check $(date -u +%H:%M:%S)] $*" | tee -a "$SUMMARY"; }
left_s() { echo $((DEADLINE_S - SECONDS)); }
min() { if [ "$1" -lt "$2" ]; then echo "$1"; else echo "$2"; fi; }

stage() {  # stage NAME TIMEOUT_S LOGFILE CMD...   (the timeout is capped by the time left)
    local name="$1" limit="$2" logfile="$3"
    shift 3
    local left
    left=$(left_s)
    if [ "$left" -lt "$MIN_STAGE_S" ]; then
        log "stage $name: SKIPPED, ${left}s left before the ${DEADLINE_S}s deadline"
        STAGE_ROWS+=("| $name | skipped | 0 | - |")
        FAILED=1
        return 0
    fi
    limit=$(min "$limit" "$left")
    log "stage $name: start (timeout ${limit}s): $*"
    local t0=$SECONDS
    timeout --signal=TERM --kill-after=15 "$limit" "$@" > "$logfile" 2>&1
    local rc=$?
    local dt=$((SECONDS - t0)) status="rc=$rc"
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        status="TIMEOUT (rc=$rc)"
        log "stage $name: TIMEOUT after ${dt}s (rc=$rc), log $logfile"
    else
        log "stage $name: rc=$rc in ${dt}s, log $logfile"
    fi
    [ "$rc" -ne 0 ] && FAILED=1
    STAGE_ROWS+=("| $name | $status | $dt | $(basename "$logfile") |")
    tail -n 25 "$logfile" | sed "s/^/    [$name] /"
    return 0
}

log "mode: $(pick "GPU (real sizes)" "dry run (small CPU configuration)"), deadline ${DEADLINE_S}s"

# Stage 0: where are we (never fails the run).
{
    echo "date_utc: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
    echo "dry_run: $DRY_RUN"
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
# Dry run: one kernel-test file through the interpreter (make test runs them all).
read -r -a TEST_PATHS <<< "${TEST_PATHS:-$(pick tests/kernels tests/kernels/test_merge_states.py)}"
stage tests "${TEST_TIMEOUT_S:-$(pick 180 120)}" "$OUT_DIR/tests.log" \
    "$PYTHON" -m pytest "${TEST_PATHS[@]}" -q -o addopts="-ra" -p no:cacheprovider \
    --ignore=tests/kernels/test_gpu_compile.py --junitxml="$OUT_DIR/tests.xml" --durations=15

# Stage 2: the model layer on the kernels: prefilling decode of the bundled model on CUDA (bf16),
# split-S attention, chunk scores and top-B gather all dispatched to Triton.
E2E_LEN=$(pick 8192 1024)
stage e2e "${E2E_TIMEOUT_S:-$(pick 60 120)}" "$OUT_DIR/e2e.log" \
    "$PYTHON" -m dllm eval passkey --lengths "$E2E_LEN" --depths $(pick "0 0.5 1" "0.5") --samples $(pick 2 1) \
    --method prefilling --chunk-size $(pick 256 128) --top-k 4 --token-budget $(pick 128 64) --gen-length 8 \
    --out "$OUT_DIR/e2e_prefilling_gpu.csv"

# Stage 3: the paper's headline at the Dream-7B shape (random bf16 weights): dense, prefix_cache
# and prefilling (C=1024, K=4) at 8K/16K/32K, 32 new tokens, one table with the ratios and the
# paper's 9.1-28x beside them. Its --budget-s covers the whole run (model build, warm-ups); cells
# predicted to overrun it are skipped with their predicted time. Dry run: the 2-layer cpu shape.
DREAM_BUDGET_S=$(min "${DREAM_BUDGET_S:-$(pick 200 90)}" $(($(left_s) - 60)))
stage e2e_dream "$((DREAM_BUDGET_S + 60))" "$OUT_DIR/e2e_dream_shape.log" \
    "$PYTHON" -m bench.e2e_dream_shape --shape "$(pick dream7b cpu)" --budget-s "$DREAM_BUDGET_S" --out "$OUT_DIR"

# Stage 4: the prefilling denoising step replayed from a CUDA graph vs run eagerly: the same tokens (the
# bundled model on single prompts and a ragged batch; a Dream-7B-wide random model of CUDA_GRAPH_LAYERS
# layers over a random K=4 x C=1024 cache, 1 and 8 rows) and the time per step both ways. Without CUDA
# it writes why it skipped and succeeds: the dry run has no CUDA graph to capture.
stage cuda_graph "${CUDA_GRAPH_TIMEOUT_S:-$(pick 120 60)}" "$OUT_DIR/cuda_graph.log" \
    "$PYTHON" -m bench.cuda_graph_check --out "$OUT_DIR" --layers "${CUDA_GRAPH_LAYERS:-8}" $(pick "" --dry-run)

# Stage 5 (last, takes what is left): microbenchmarks (runs even if tests failed; it re-checks
# correctness itself). On a GPU each latency is also given as a percentage of the H200 lower bound
# of bench/roofline.py. Dry run: a few seconds of cases, no FlexAttention compile.
BENCH_MARGIN_S=60   # bench stops starting new cases at its budget; the last case and the CSV need the rest
BENCH_BUDGET_S=$(min "${BENCH_BUDGET_S:-$(pick 130 5)}" $(($(left_s) - BENCH_MARGIN_S - 5)))
[ "$BENCH_BUDGET_S" -lt 1 ] && BENCH_BUDGET_S=1
stage bench "$((BENCH_BUDGET_S + BENCH_MARGIN_S))" "$OUT_DIR/bench.log" \
    "$PYTHON" -m bench.bench_kernels --out "$OUT_DIR" --budget-s "$BENCH_BUDGET_S" $(pick "" --no-flex)

{
    echo
    echo "| stage | status | seconds | log |"
    echo "|---|---|---:|---|"
    printf '%s\n' "${STAGE_ROWS[@]}"
    if [ -f "$OUT_DIR/cuda_graph.md" ]; then
        echo
        echo "CUDA-graph step vs eager (bench/cuda_graph_check.py):"
        echo
        sed -n '/^| part\|^Skipped/,$p' "$OUT_DIR/cuda_graph.md"
    fi
    if [ -f "$OUT_DIR/e2e_dream_shape.md" ]; then
        echo
        echo "End to end at the $(pick "Dream-7B" "small CPU (dry run)") shape (bench/e2e_dream_shape.py):"
        echo
        cat "$OUT_DIR/e2e_dream_shape.md"
    fi
} | tee -a "$SUMMARY"
log "done: total ${SECONDS}s, failed=$FAILED; outputs in $OUT_DIR"
exit "$FAILED"
