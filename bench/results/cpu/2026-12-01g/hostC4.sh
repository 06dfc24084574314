#!/usr/bin/env bash
# Round 4, part 3 of 3: Ray installed; 16 local workers, then Ray joined at 64 (the default) and 128 shards, traced
# (where the driver's time goes: its start, the tasks, the merge, the shards' removal), 8 GB never repeating, certified.
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken" 2>/dev/null || { echo "not the machine of hostA.sh"; exit 3; }
[ -f /tmp/ray/raypart.01 ] || { echo "no first two thirds"; exit 3; }
ls qwen_data/*.so > /dev/null 2>&1 || python3 setup.py build_ext --inplace > /dev/null 2>&1
cat /tmp/ray/raypart.00 /tmp/ray/raypart.01 .cpuray2/raypart.02 > /tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
python3 -m pip install -q --no-index --find-links .cpuray2 /tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl 2>&1 | grep -v WARN | tail -3
C=$QWEN_DATA_BENCH_CACHE/certify/text-unique-8000MB.jsonl
rm -rf /tmp/o; python3 -m qwen_data pretrain $QWEN_DATA_BENCH_CACHE/text.jsonl -o /tmp/o/w --workers 16 --quiet > /dev/null
rm -rf /tmp/o; /usr/bin/time -f "local 16 workers: %e s" python3 -m qwen_data pretrain $C -o /tmp/o/w --workers 16 --quiet 2>&1 | tail -1
FP=$(python3 -c "import json; print(json.load(open('/tmp/o/w.json'))['fingerprint'])")
python3 -m ray.scripts.scripts start --head --num-cpus 16 --include-dashboard=false --disable-usage-stats > /dev/null 2>&1
for n in 64 128 64; do
  rm -rf /tmp/o; echo "== ray joined, $n shards"
  RAY_ADDRESS=auto /usr/bin/time -f "%e s wall" python3 .cpu19/trace.py pretrain $C -o /tmp/o/r --executor ray --ray-shards $n 2>&1 | grep -E "^\[|wall|^ray:|rror" | grep -v "\[ray\]\|\[merge\|imported\|python up\|check_not"
  python3 -c "import json; print('same fingerprint as local:', json.load(open('/tmp/o/r.json'))['fingerprint'] == '$FP')"
done
python3 -m ray.scripts.scripts stop > /dev/null 2>&1
