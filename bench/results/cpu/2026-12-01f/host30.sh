#!/usr/bin/env bash
# The same as host29.sh on the tree after the newlines count (cd39bf2): a second machine, part 3 of 3.
# 16 local workers, then --executor ray joined to a cluster of 16 CPUs at 16 shards, twice; 2 GB never repeating.
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken" 2>/dev/null || { echo "not the machine of host28.sh"; exit 3; }
ls qwen_data/*.so > /dev/null 2>&1 || python3 setup.py build_ext --inplace > /dev/null 2>&1
cat /tmp/ray/raypart.00 /tmp/ray/raypart.01 .cpuray2/raypart.02 > /tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
python3 -m pip install -q --no-index --find-links .cpuray2 /tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl 2>&1 | grep -v WARN | tail -3
C=$QWEN_DATA_BENCH_CACHE/certify/text-unique-2000MB.jsonl
rm -rf /tmp/o; python3 -m qwen_data pretrain $C -o /tmp/o/w --workers 16 --quiet > /dev/null  # (bytecode, caches)
for r in 1 2; do rm -rf /tmp/o; /usr/bin/time -f "local 16 workers: %e s" python3 -m qwen_data pretrain $C -o /tmp/o/w --workers 16 --quiet > /dev/null; done
for env in default; do
  extra=$([ $env = blas1 ] && echo "OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1")
  env $extra python3 -m ray.scripts.scripts start --head --num-cpus 16 --include-dashboard=false --disable-usage-stats > /dev/null 2>&1
  for r in 1 2; do
    rm -rf /tmp/o; RAY_ADDRESS=auto /usr/bin/time -f "ray joined ($env): %e s" python3 -m qwen_data pretrain $C -o /tmp/o/r --executor ray --ray-shards 16 2>&1 | grep -E "^ray|joined|rror"
  done
  python3 -m ray.scripts.scripts stop > /dev/null 2>&1
done
