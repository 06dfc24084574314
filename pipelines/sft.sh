#!/usr/bin/env bash
# SFT recipe for Qwen3: chats (messages / ShareGPT / alpaca, mixed) → packed rows of SEQ tokens,
# one sample per assistant turn (`--history split`: each turn rendered as Qwen3 sees it at
# inference), held-out validation chats → a per-split blend weighted by tokens → training.
#
#   TRAIN="sft/*.jsonl" VALID="sft_valid.jsonl" bash pipelines/sft.sh [OUT_DIR]
#
# Settings (environment): TRAIN, VALID (input globs), MODEL (default qwen3-1.7b), GPUS (default 8),
# TP (default 1), SEQ (default 4096), ITERS (default 1000), GBS (default 64), MBS (micro batch,
# default 2; 4 is fastest where it fits: Qwen2.5-1.5B at 4 × 4096 takes 58 GiB of one GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-out/sft}
: "${TRAIN:?set TRAIN to the training chats (a glob)}" "${VALID:?set VALID to the validation chats}"
MODEL=${MODEL:-qwen3-1.7b} GPUS=${GPUS:-8} TP=${TP:-1} SEQ=${SEQ:-4096} ITERS=${ITERS:-1000} GBS=${GBS:-64}
MBS=${MBS:-2}

sft=(qwen-data sft --template qwen3 --history split --seq-length "$SEQ" --pack --workers "$(nproc)")
# shellcheck disable=SC2086
"${sft[@]}" $TRAIN -o "$out/train"
# shellcheck disable=SC2086
"${sft[@]}" $VALID -o "$out/valid"

qwen-data blend "$out/train" --valid "$out/valid" -o "$out/blend.json" \
  --train-iters "$ITERS" --global-batch-size "$GBS" --seq-length "$SEQ"

# Packed rows: samples never attend to each other (FlexAttention document mask, or THD with
# Transformer Engine); loss only on assistant tokens; the pad id comes from the manifests.
torchrun --nproc-per-node "$GPUS" -m qwen_data_train --data "$out/blend.json" --model "$MODEL" --tp "$TP" \
  --seq-length "$SEQ" --micro-batch-size "$MBS" --global-batch-size "$GBS" --train-iters "$ITERS" \
  --lr 1e-5 --min-lr 1e-6 --warmup-iters $((ITERS / 30 + 1)) --weight-decay 0.0 \
  --eval-interval 100 --eval-iters 20 --save "$out/ckpt" --save-interval 250 --load "$out/ckpt" \
  --data-cache "$out/cache" --log-json "$out/train_log.jsonl"
