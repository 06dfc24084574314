#!/usr/bin/env bash
# Call 3, after hostB.sh on the same host: what the certificate costs at 16 workers on the corpora hostA.sh made, each
# layer apart (bench/certify.py --layers: --no-certify, every document spelled with no reference sample, certified;
# interleaved, 2 rounds): pretrain on 8 GB of text, packed SFT on 2 GB of chats, neither repeating.
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken" 2>/dev/null || { echo "not the machine of hostA.sh"; exit 3; }
D=$QWEN_DATA_BENCH_CACHE/certify
timeout 330 python3 bench/certify.py --layers $D/text-unique-8000MB.jsonl --workers 16 --rounds 2 \
  --json $OUT/layers-pretrain-8g.json 2>&1 | tail -3
timeout 200 python3 bench/certify.py --layers $D/chat-unique-2000MB.jsonl --sft --workers 16 --rounds 2 \
  --reference-template /tmp/qwen2.5-instruct.jinja --json $OUT/layers-sft-2g.json 2>&1 | tail -3
