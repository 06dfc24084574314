#!/usr/bin/env bash
# Call 2 of 2, right after hostH.sh on the same host: Ray installed; then bench/cores.py as issue 59 names it, every
# run certified: pretrain at 1 and 16 workers on 8 GB that never repeats (the host's share-nothing ceiling measured
# on it in the same run) and on the repeated 8 GB beside it; packed SFT chats and alpaca at 1 and 16 workers on
# 2 GB each; Ray joined to a running cluster at 16 shards on the same 8 GB. Every count above one
# worker three times (`--rounds 3`, `--ray-rounds 3`): the json's `summary` gives the medians.
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken" 2>/dev/null || { echo "not the machine of hostH.sh"; exit 3; }
[ -f /tmp/ray/raypart.00 ] || { echo "no first third"; exit 3; }
W=/tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
cat /tmp/ray/raypart.00 .cpuray2/raypart.01 .cpuray2/raypart.02 > $W
python3 -m pip install -q --no-index --find-links .cpuray2 $W 2>&1 | grep -v WARN | tail -3
T0=$(date +%s)
timeout 580 python3 bench/cores.py --unique --corpus-mb 8000 --sft-mb 2000 --workers 1,16 \
  --jobs pretrain,sft-chat,sft-alpaca --ray --ray-joined-only --ray-shards 16 --rounds 3 --ray-rounds 3 \
  --reference-template /tmp/qwen2.5-instruct.jinja --out $OUT/cores.json > $OUT/cores.log 2>&1
echo "cores rc $? $(( $(date +%s) - T0 )) s"
tail -24 $OUT/cores.log
