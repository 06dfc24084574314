#!/usr/bin/env bash
# Ray joined, 64 shards, 8 GB: the shards removed by kept.remove (8 threads) against shutil.rmtree (one), alternating.
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import ray, gigatoken" 2>/dev/null || { echo "a fresh machine"; exit 3; }
C=$QWEN_DATA_BENCH_CACHE/certify/text-unique-8000MB.jsonl
python3 -m ray.scripts.scripts start --head --num-cpus 16 --include-dashboard=false --disable-usage-stats > /dev/null 2>&1
for mode in threads one one threads; do
  rm -rf /tmp/o; sync; echo "== $mode"
  RAY_ADDRESS=auto RM_MODE=$mode /usr/bin/time -f "%e s wall" python3 .cpu19/trace.py pretrain $C -o /tmp/o/r --executor ray --ray-shards 64 2>&1 | grep -E "remove|main returned|wall|merged"
done
python3 -m ray.scripts.scripts stop > /dev/null 2>&1
