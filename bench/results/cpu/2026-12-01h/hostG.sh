#!/usr/bin/env bash
# After a713d8f, part 3 of 3: Ray installed; bench/cores.py's local 16 workers against Ray joined at 16 and 64
# shards (the default), 8 GB never repeating, certified; then a 64-shard run traced (trace.py).
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken" 2>/dev/null || { echo "not the machine of hostE.sh"; exit 3; }
[ -f /tmp/ray/raypart.01 ] || { echo "no first two thirds"; exit 3; }
cat /tmp/ray/raypart.00 /tmp/ray/raypart.01 .cpuray2/raypart.02 > /tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
python3 -m pip install -q --no-index --find-links .cpuray2 /tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl 2>&1 | grep -v WARN | tail -3
python3 bench/cores.py --unique --corpus-mb 8000 --workers 16 --jobs pretrain --ray --ray-joined-only \
  --ray-shards 16,0 --out $OUT/cores-ray-joined-8g-a713d8f.json 2>&1 | tail -9
C=$QWEN_DATA_BENCH_CACHE/certify/text-unique-8000MB.jsonl
python3 -m ray.scripts.scripts start --head --num-cpus 16 --include-dashboard=false --disable-usage-stats > /dev/null 2>&1
rm -rf /tmp/o; echo "== ray joined, 64 shards, traced"
RAY_ADDRESS=auto /usr/bin/time -f "%e s wall" python3 .cpu19/trace.py pretrain $C -o /tmp/o/r --executor ray --ray-shards 64 2>&1 | grep -E "^\[|wall|^ray:|rror" | grep -v "\[ray\]\|\[merge\|imported\|python up\|check_not"
python3 -m ray.scripts.scripts stop > /dev/null 2>&1
