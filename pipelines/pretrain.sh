#!/usr/bin/env bash
# Pretraining recipe: web text and code → two prefixes → a 70/30 token blend with a 98/2/0
# split → Qwen2.5-1.5B on one node with tensor parallelism 2.
#
#   WEB="crawl/*.jsonl.gz" CODE="code/*.jsonl" bash pipelines/pretrain.sh [OUT_DIR]
#
# Settings (environment): WEB, CODE (input globs), MODEL (a train preset, default qwen2.5-1.5b),
# GPUS (default 8), TP (default 2), SEQ (default 4096), ITERS (default 2000), GBS (default 256),
# MBS (micro batch, default 4: Qwen2.5-1.5B at 4 × 4096 takes 58 GiB of one GPU without TP),
# WORKERS (tokenizer processes, default: all cores).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-out/pretrain}
: "${WEB:?set WEB to the web-text jsonl files (a glob)}" "${CODE:?set CODE to the code jsonl files (a glob)}"
MODEL=${MODEL:-qwen2.5-1.5b} GPUS=${GPUS:-8} TP=${TP:-2} SEQ=${SEQ:-4096} ITERS=${ITERS:-2000} GBS=${GBS:-256}
MBS=${MBS:-4} WORKERS=${WORKERS:-$(nproc)}

# shellcheck disable=SC2086  # the globs are meant to expand
qwen-data pretrain $WEB -o "$out/web" --workers "$WORKERS"
# shellcheck disable=SC2086
qwen-data pretrain $CODE -o "$out/code" --workers "$WORKERS"

# Ratios are shares of training tokens; the budget line shows how many epochs of each source it takes.
qwen-data blend "$out/web=0.7" "$out/code=0.3" --split 98,2,0 -o "$out/blend" \
  --train-iters "$ITERS" --global-batch-size "$GBS" --seq-length "$SEQ"

torchrun --nproc-per-node "$GPUS" -m qwen_data_train --data "$out/blend.txt" --model "$MODEL" --tp "$TP" \
  --seq-length "$SEQ" --micro-batch-size "$MBS" --global-batch-size "$GBS" --train-iters "$ITERS" \
  --lr 3e-4 --min-lr 3e-5 --warmup-iters $((ITERS / 50 + 1)) \
  --eval-interval 200 --eval-iters 10 --save "$out/ckpt" --save-interval 500 --load "$out/ckpt" \
  --data-cache "$out/cache" --log-json "$out/train_log.jsonl"
