#!/usr/bin/env bash
# Round 3, part 3 of 3: Ray installed; one traced run joined at the default shard count (where the driver's time
# goes), then bench/cores.py: 16 local workers and Ray joined at 16 shards and at the default count, 8 GB, certified.
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken" 2>/dev/null || { echo "not the machine of hostA3.sh"; exit 3; }
[ -f /tmp/ray/raypart.01 ] || { echo "no first two thirds"; exit 3; }
ls qwen_data/*.so > /dev/null 2>&1 || python3 setup.py build_ext --inplace > /dev/null 2>&1
cat /tmp/ray/raypart.00 /tmp/ray/raypart.01 .cpuray2/raypart.02 > /tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
python3 -m pip install -q --no-index --find-links .cpuray2 /tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl 2>&1 | grep -v WARN | tail -3
C=$QWEN_DATA_BENCH_CACHE/certify/text-unique-8000MB.jsonl
python3 -m ray.scripts.scripts start --head --num-cpus 16 --include-dashboard=false --disable-usage-stats > /dev/null 2>&1
rm -rf /tmp/o; RAY_ADDRESS=auto /usr/bin/time -f "%e s wall" python3 .cpu19/trace.py pretrain $C -o /tmp/o/r --executor ray 2>&1 | grep -E "^\[|wall|^ray:|rror" | grep -v "\[ray\]\|\[merge" | tee $OUT/trace.log
python3 -m ray.scripts.scripts stop > /dev/null 2>&1; rm -rf /tmp/o
T0=$(date +%s)
timeout 400 python3 bench/cores.py --unique --corpus-mb 8000 --workers 16 --jobs pretrain --ray --ray-joined-only \
  --ray-shards 16,0 --out $OUT/cores-ray-joined-8g.json > $OUT/cores-ray.log 2>&1
echo "cores rc $? $(( $(date +%s) - T0 )) s"
tail -8 $OUT/cores-ray.log
python3 -c "
import json; d = json.load(open('$OUT/cores-ray-joined-8g.json'))
for r in d['runs']: print(r['job'], r.get('shards'), r['wall_s'], r.get('fingerprint', '')[:16], r.get('ray_log', ''))
"
