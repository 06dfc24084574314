#!/usr/bin/env bash
# Call 2 of 2, right after hostK.sh: Ray installed, a cluster started (16 CPUs) and joined once (so that no timed
# run is its first driver), then three rounds on the 8 GB: 16 local workers, Ray joined at 16 shards without the
# head start (QD_HEAD=0) and with it (the default), the two Ray kinds' order alternating; every run certified.
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken" 2>/dev/null || { echo "not the machine of hostK.sh"; exit 3; }
[ -f /tmp/ray/raypart.00 ] || { echo "no first third"; exit 3; }
W=/tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
cat /tmp/ray/raypart.00 .cpuray2/raypart.01 .cpuray2/raypart.02 > $W
python3 -m pip install -q --no-index --find-links .cpuray2 $W 2>&1 | grep -v WARN | tail -3
T=$QWEN_DATA_BENCH_CACHE/certify/text-unique-8000MB.jsonl
ray start --head --num-cpus 16 --include-dashboard=false > /dev/null 2>&1
python3 -c "import ray; ray.init(address='auto', log_to_driver=False); ray.shutdown()" 2>/dev/null; echo warmed
one() {  # name, env, args...
  local name=$1 env=$2; shift 2
  rm -rf /tmp/o; mkdir -p /tmp/o
  local t=$(date +%s.%N)
  env $env python3 bench/results/cpu/2026-12-03d/rayab.py pretrain $T -o /tmp/o/x --quiet "$@" > /tmp/o.log 2>&1
  local rc=$? e=$(date +%s.%N)
  echo "$name rc $rc wall $(python3 -c "print(round($e - $t, 2))") fp $(python3 -c "import json; print(json.load(open('/tmp/o/x.json'))['fingerprint'][:16])" 2>/dev/null) $(grep INFO /tmp/o.log)"
  [ $rc = 0 ] || tail -5 /tmp/o.log
}
R="--executor ray --ray-address auto --ray-shards 16"
for round in 1 2 3; do
  one local "X=1" --workers 16
  if [ $round = 2 ]; then one ray-head "QD_HEAD=3" $R; one ray-nohead "QD_HEAD=0" $R
  else one ray-nohead "QD_HEAD=0" $R; one ray-head "QD_HEAD=3" $R; fi
done
ray stop --force > /dev/null 2>&1
