#!/usr/bin/env bash
# The second host, call 2 of 2, right after hostD.sh: Ray installed, then bench/cores.py with --ray-rounds 3 (each Ray
# run joined to a running cluster at 16 shards, right after a run of 16 local workers on the same 8 GB).
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken" 2>/dev/null || { echo "not the machine of hostD.sh"; exit 3; }
[ -f /tmp/ray/raypart.00 ] || { echo "no first third"; exit 3; }
cat /tmp/ray/raypart.00 .cpuray2/raypart.01 .cpuray2/raypart.02 > /tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
python3 -m pip install -q --no-index --find-links .cpuray2 /tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl 2>&1 | grep -v WARN | tail -3
T0=$(date +%s)
timeout 560 python3 bench/cores.py --unique --no-repeated --corpus-mb 8000 --workers 16 --jobs pretrain --ray \
  --ray-joined-only --ray-shards 16 --ray-rounds 3 --out $OUT/cores-ray-rounds-8g.json > $OUT/cores-ray-rounds.log 2>&1
echo "cores rc $? $(( $(date +%s) - T0 )) s"
tail -12 $OUT/cores-ray-rounds.log
