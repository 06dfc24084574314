#!/usr/bin/env bash
# Ray joined at 16 shards, part 3 of 3: Ray 2.60.0 installed (its wheel joined from the two thirds the call between
# kept in /tmp and the one this call carried), then bench/cores.py --unique --corpus-mb 8000 --workers 16 --jobs pretrain --ray: 16 local workers,
# the repeated text, Ray started by the run and Ray joined to a cluster started beforehand, certified.
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken" 2>/dev/null || { echo "not the machine of host26.sh"; exit 3; }
[ -f /tmp/ray/raypart.01 ] || { echo "no first two thirds"; exit 3; }
cat /tmp/ray/raypart.00 /tmp/ray/raypart.01 .cpuray2/raypart.02 > /tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
T0=$(date +%s)
python3 -m pip install -q --no-index --find-links .cpuray2 /tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl 2>&1 | grep -v WARN | tail -3
python3 -c "import ray; print('ray', ray.__version__)"
echo "install $(( $(date +%s) - T0 )) s"
timeout 520 python3 bench/cores.py --unique --corpus-mb 8000 --workers 16 --jobs pretrain --ray \
  --out $OUT/cores-ray-joined-8g.json > $OUT/cores-ray.log 2>&1
echo "cores rc $? $(( $(date +%s) - T0 )) s"
tail -12 $OUT/cores-ray.log
python3 -c "
import json; d = json.load(open('$OUT/cores-ray-joined-8g.json'))
for r in d['runs']: print(r['job'], r['workers'], r['wall_s'], r.get('fingerprint', '')[:16], r.get('ray_log', ''))
"
