#!/usr/bin/env bash
# Part 2 of 2: alpaca's A/B (ab.py, one round); then SFT chats and alpaca at 1 and 16 workers, certified, 2 GB each,
# with the host's share-nothing ceiling measured on 1 GB of text that never repeats (bench/cores.py).
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken" 2>/dev/null && [ -f $QWEN_DATA_BENCH_CACHE/certify/alpaca-unique-2000MB.jsonl ] \
  || { echo "not the machine of hostA.sh"; exit 3; }
T=.cpu19/qwen2.5-instruct.jinja
timeout 120 python3 bench/results/cpu/2026-12-02/ab.py $QWEN_DATA_BENCH_CACHE/certify/alpaca-unique-2000MB.jsonl 16 1 $T \
  $OUT/ab-alpaca.jsonl 2>&1 | grep -v "^rejected\|more rejected"
timeout 420 python3 bench/cores.py --unique --corpus-mb 1000 --sft-mb 2000 --workers 1,16 --jobs sft-chat,sft-alpaca \
  --reference-template $T --out $OUT/cores-sft-2g.json 2>&1 | grep -v "^rejected\|more rejected"
