#!/usr/bin/env bash
# Calls 2 and 3, right after hostM.sh: `hostN.sh pretrain`, then `hostN.sh sft`, which adds its runs to the same
# cores.json (`bench/cores.py --continue`: one host, one boot). Every run certified; SFT against the official Jinja.
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken" 2>/dev/null && [ -f /tmp/qwen2.5-instruct.jinja ] || { echo "not hostM.sh's machine"; exit 3; }
mkdir -p /tmp/cores
A="--unique --corpus-mb 8000 --sft-mb 4000 --workers 1,16 --rounds 3 --adjacent-ceiling --out /tmp/cores/cores.json
   --reference-template /tmp/qwen2.5-instruct.jinja"
T0=$(date +%s)
if [ "$1" = pretrain ]; then
  (cd bench && timeout 570 python3 cores.py $A --jobs pretrain) 2>&1 | tee -a /tmp/cores/cores.log | tail -12
else
  (cd bench && timeout 570 python3 cores.py $A --jobs sft-chat,sft-alpaca --continue) 2>&1 | tee -a /tmp/cores/cores.log | tail -12
fi
echo "$1: $(( $(date +%s) - T0 )) s"
cp /tmp/cores/* $OUT/
