#!/usr/bin/env bash
# Part 2 of 3: two thirds of Ray's wheel kept in /tmp; SFT chats and alpaca at 1 and 16 workers, certified, 2 GB
# each (bench/cores.py), then each 16-worker run again with every process's CPU (percpu.py).
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken" 2>/dev/null || { echo "not the machine of hostA.sh"; exit 3; }
mkdir -p /tmp/ray && cp .cpuray1/raypart.0* /tmp/ray/
python3 bench/cores.py --unique --corpus-mb 8000 --sft-mb 2000 --workers 1,16 --jobs sft-chat,sft-alpaca \
  --reference-template .cpu19/qwen2.5-instruct.jinja --out $OUT/cores-sft-2g.json 2>&1 | grep -v "^rejected\|more rejected"
for kind in chat alpaca; do
  echo "== $kind, 16 workers, every process's CPU s"
  rm -rf /tmp/o; python3 .cpu19/percpu.py python3 -m qwen_data sft $QWEN_DATA_BENCH_CACHE/certify/$kind-unique-2000MB.jsonl \
    --template qwen2p5 --pack --seq-length 4096 --workers 16 -o /tmp/o/s --quiet \
    --reference-template .cpu19/qwen2.5-instruct.jinja 2>&1 | grep -v "^rejected\|more rejected"
done
