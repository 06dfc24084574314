#!/usr/bin/env bash
# The whole path on the bundled examples, small enough for a laptop CPU (or one GPU):
# pretrain and packed-SFT prefixes → blends → a few steps of the tiny Qwen-shaped model on each.
#
#   bash pipelines/example.sh [OUT_DIR]          # default out/example
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-out/example}
train=(qwen-data train --model tiny --seq-length 512 --micro-batch-size 2 --global-batch-size 4
       --train-iters 4 --log-interval 1 --num-workers 0)

# 1. Prefixes (no input files: the bundled corpus and chats, the bundled Qwen tokenizer).
qwen-data pretrain -o "$out/web" --quiet
qwen-data sft --template qwen2p5 -o "$out/chat" --seq-length 512 --pack --quiet

# 2. Blends: what Megatron-LM's --data-args-path / --per-split-data-args-path take.
qwen-data blend "$out/web" -o "$out/pretrain_blend.json"
qwen-data blend "$out/chat" -o "$out/sft_blend.json"

# 3. Train through megatron-core's BlendedMegatronDatasetBuilder (from scratch: an earlier run's checkpoint goes).
rm -rf "$out/ckpt"
"${train[@]}" --data "$out/pretrain_blend.json" --save "$out/ckpt"
"${train[@]}" --data "$out/sft_blend.json"
