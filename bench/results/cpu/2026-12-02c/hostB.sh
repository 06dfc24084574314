#!/usr/bin/env bash
# After ../2026-12-02b/hostA.sh (a fresh host: wheels, 8 GB of text that never repeats, Ray's first third): Ray
# installed; 16 local workers against Ray joined at 16 shards (parts of 32 MB, the default, and of 16 MB), alternating,
# each Ray run's phases marked (rayph.py, phases.py).
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken" 2>/dev/null || { echo "not the machine of hostA.sh"; exit 3; }
[ -f /tmp/ray/raypart.00 ] || { echo "no first third"; exit 3; }
cat /tmp/ray/raypart.00 .cpuray2/raypart.01 .cpuray2/raypart.02 > /tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
python3 -m pip install -q --no-index --find-links .cpuray2 /tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl 2>&1 | grep -v WARN | tail -3
C=$QWEN_DATA_BENCH_CACHE/certify/text-unique-8000MB.jsonl
ls -la $C || exit 3
python3 bench/results/cpu/2026-12-02c/rayph.py $C ${ROUNDS:-2} $OUT/rayph.jsonl ${CASES:-local-16,ray-16:.:0,ray-16-16mb:.:16} 2>&1 | grep -v "^rejected"
