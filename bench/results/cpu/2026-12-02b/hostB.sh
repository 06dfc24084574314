#!/usr/bin/env bash
# Part 2 of 2: Ray installed; 16 local workers against Ray joined to a running cluster: this checkout's 16 shards
# (parts in turn) and the commit before's (.cpubase, 93a09a7: contiguous shards) at 16 and at its default of 64,
# alternating (rayab.py); then bench/cores.py's record of local and Ray joined at 16 shards.
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken" 2>/dev/null || { echo "not the machine of hostA.sh"; exit 3; }
[ -f /tmp/ray/raypart.00 ] || { echo "no first third"; exit 3; }
cat /tmp/ray/raypart.00 .cpuray2/raypart.01 .cpuray2/raypart.02 > /tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
python3 -m pip install -q --no-index --find-links .cpuray2 /tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl 2>&1 | grep -v WARN | tail -3
C=$QWEN_DATA_BENCH_CACHE/certify/text-unique-8000MB.jsonl
ls -la $C || exit 3
python3 bench/results/cpu/2026-12-02b/rayab.py $C 2 $OUT/rayab.jsonl 2>&1 | grep -v "^rejected"
python3 bench/cores.py --unique --corpus-mb 8000 --workers 16 --jobs pretrain --ray --ray-joined-only \
  --ray-shards 16 --out $OUT/cores-ray-joined-8g.json 2>&1 | tail -9
