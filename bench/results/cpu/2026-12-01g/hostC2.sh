#!/usr/bin/env bash
# Round 2, part 3 of 3: Ray installed; the merge's copy by thread count; bench/cores.py's Ray joined at 16, auto
# and 64 shards on 8 GB that never repeats, beside 16 local workers (certified, the default).
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken" 2>/dev/null || { echo "not the machine of hostA.sh"; exit 3; }
[ -f /tmp/ray/raypart.01 ] || { echo "no first two thirds"; exit 3; }
ls qwen_data/*.so > /dev/null 2>&1 || python3 setup.py build_ext --inplace > /dev/null 2>&1
cat /tmp/ray/raypart.00 /tmp/ray/raypart.01 .cpuray2/raypart.02 > /tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
python3 -m pip install -q --no-index --find-links .cpuray2 /tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl 2>&1 | grep -v WARN | tail -3
git log --oneline -1 | cut -c1-60
python3 bench/results/cpu/2026-12-01g/merge_copy.py /tmp/cp 16 530 2>&1 | tee $OUT/merge-copy.log; rm -rf /tmp/cp
T0=$(date +%s)
timeout 480 python3 bench/cores.py --unique --corpus-mb 8000 --workers 16 --jobs pretrain --ray --ray-joined-only \
  --ray-shards 16,0,64 --out $OUT/cores-ray-joined-8g.json > $OUT/cores-ray.log 2>&1
echo "cores rc $? $(( $(date +%s) - T0 )) s"
tail -12 $OUT/cores-ray.log
python3 -c "
import json; d = json.load(open('$OUT/cores-ray-joined-8g.json'))
for r in d['runs']: print(r['job'], r.get('shards'), r['wall_s'], r.get('fingerprint', '')[:16], r.get('ray_log', ''))
"
