#!/usr/bin/env bash
# The tiny model from scratch in one short GPU run (issue 37), one command per device call:
#
#     OUT=$OUT bash bench/tiny/gpu_scratch.sh [bench.tiny.gpu_run flags]                # first call
#     OUT=$OUT RESUME=bench/tiny/gpu_state bash bench/tiny/gpu_scratch.sh [same flags]   # next calls
#
# Trains bench.tiny.gpu_run's default size (384 x 6 layers, 9.5M parameters) for --steps (default 6000
# steps of 65,536 tokens) and stops after BUDGET_S seconds (default 510, under 9 minutes with start-up);
# writes the state shards (weights + AdamW moments), run.json and loss.csv into $OUT: at most 8 files of
# at most 16 MiB. To resume on a fresh machine, copy those files back into the working tree (an ignored
# folder such as bench/tiny/gpu_state/) and carry it with RESUME pointing there. Needs the packed corpus
# (python -m bench.tiny.corpus, built on a machine with the package registries; carried as
# bench/tiny/corpus_build, ~24 MB) and a Python with torch, numpy and safetensors ($PYTHON, default
# python3). The HF checkpoint: python -m bench.tiny.gpu_run export --state $OUT --model <folder>.
# DEVICE=cpu with tiny sizes is the dry run of tests/test_gpu_run.py.
set -euo pipefail
: "${OUT:?set OUT to the folder the state, run.json and loss.csv go to}"
PYTHON=${PYTHON:-python3}
CORPUS=${CORPUS:-bench/tiny/corpus_build}
cd "$(dirname "$0")/../.."
if [ ! -f "$CORPUS/manifest.json" ]; then
    echo "error: no corpus at $CORPUS: build it with python -m bench.tiny.corpus --out $CORPUS and carry it" >&2
    exit 2
fi
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
exec "$PYTHON" -m bench.tiny.gpu_run --out "$OUT" --corpus "$CORPUS" --device "${DEVICE:-cuda}" \
    --budget-s "${BUDGET_S:-510}" ${RESUME:+--resume "$RESUME"} "$@"
