#!/usr/bin/env bash
# The tiny model from scratch in one short GPU run, one command per device call:
#
#     OUT=$OUT bash bench/tiny/gpu_scratch.sh [bench.tiny.gpu_run flags]              # first call
#     OUT=$OUT RESUME=1 bash bench/tiny/gpu_scratch.sh [the same flags]               # later calls
#
# Trains bench.tiny.gpu_run's default size (320 x 6 layers, 6.7M parameters) for --steps (default 6000 steps
# of 65,536 tokens) and stops after BUDGET_S seconds (default 510: under 9 minutes with start-up). The state
# (weights, AdamW moments, run.json with the step = the data position, loss.csv) is written to STATE
# (default bench/tiny/gpu_state, git-ignored: on the device machine it stays in the working tree while
# the machine is warm) and copied into $OUT when the run ends, however it ends: at most 8 files of at
# most 16 MiB. RESUME=1 continues from STATE; on a fresh machine, copy the files that came back into
# bench/tiny/gpu_state here and carry it with the corpus (51 + 6 MiB: within the 64 MiB carried).
# Needs the packed corpus (python -m bench.tiny.corpus, built where the package registries are; carried
# as bench/tiny/corpus_build) and a Python with torch, numpy and safetensors ($PYTHON, default python3).
# The HF checkpoint: python -m bench.tiny.gpu_run export --state $OUT --model <folder>.
# DEVICE=cpu with tiny sizes is the dry run of tests/test_gpu_run.py.
set -euo pipefail
: "${OUT:?set OUT to the folder the state, run.json and loss.csv go to}"
PYTHON=${PYTHON:-python3}
CORPUS=${CORPUS:-bench/tiny/corpus_build}
STATE=${STATE:-bench/tiny/gpu_state}
cd "$(dirname "$0")/../.."
if [ ! -f "$CORPUS/manifest.json" ]; then
    echo "error: no corpus at $CORPUS: build it with python -m bench.tiny.corpus --out $CORPUS and carry it" >&2
    exit 2
fi
if [ -n "${RESUME:-}" ] && [ ! -f "$STATE/run.json" ]; then
    echo "error: RESUME is set but $STATE holds no run.json" >&2
    exit 2
fi
mkdir -p "$OUT" "$STATE"
copy_out() { cp "$STATE"/run.json "$STATE"/loss.csv "$STATE"/state-*.safetensors "$OUT"/ 2>/dev/null || true; }
trap copy_out EXIT
trap 'exit 143' TERM INT
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
"$PYTHON" -m bench.tiny.gpu_run --out "$STATE" --corpus "$CORPUS" --device "${DEVICE:-cuda}" \
    --budget-s "${BUDGET_S:-510}" ${RESUME:+--resume "$STATE"} "$@"
