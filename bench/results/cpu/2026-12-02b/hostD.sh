#!/usr/bin/env bash
# After hostA16.sh, part 2 of 2: Ray installed; bench/cores.py's record of 16 local workers and Ray joined at 16
# shards on 16 GB of text that never repeats (no repeated corpus beside it: the disk holds one 16 GB corpus).
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken" 2>/dev/null || { echo "not the machine of hostA16.sh"; exit 3; }
[ -f /tmp/ray/raypart.00 ] || { echo "no first third"; exit 3; }
cat /tmp/ray/raypart.00 .cpuray2/raypart.01 .cpuray2/raypart.02 > /tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
python3 -m pip install -q --no-index --find-links .cpuray2 /tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl 2>&1 | grep -v WARN | tail -3
C=$QWEN_DATA_BENCH_CACHE/certify/text-unique-16000MB.jsonl
ls -la $C || exit 3
python3 bench/cores.py --unique --no-repeated --corpus-mb 16000 --workers 16 --jobs pretrain --ray --ray-joined-only \
  --ray-shards 16 --out $OUT/cores-ray-joined-16g.json 2>&1 | tail -6
df -h /tmp | tail -1
