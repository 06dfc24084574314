#!/usr/bin/env bash
# Round 1, part 3 of 3: Ray installed; where a Ray run's time goes on 8 GB, 16 cores.
#  local --workers 16; 16 separate --shard k/16 --workers 0 processes at once (no Ray: processes apart, tables unshared);
#  Ray joined at 16, 32 and 64 shards. --no-certify throughout (the per-byte cost, not the certificate's), then certified once.
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken" 2>/dev/null || { echo "not the machine of hostA.sh"; exit 3; }
[ -f /tmp/ray/raypart.01 ] || { echo "no first two thirds"; exit 3; }
ls qwen_data/*.so > /dev/null 2>&1 || python3 setup.py build_ext --inplace > /dev/null 2>&1
cat /tmp/ray/raypart.00 /tmp/ray/raypart.01 .cpuray2/raypart.02 > /tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
python3 -m pip install -q --no-index --find-links .cpuray2 /tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl 2>&1 | grep -v WARN | tail -3
C=$QWEN_DATA_BENCH_CACHE/certify/text-unique-8000MB.jsonl
T="/usr/bin/time -f %e_s_%U_user_%S_sys"
rm -rf /tmp/o; python3 -m qwen_data pretrain $QWEN_DATA_BENCH_CACHE/text.jsonl -o /tmp/o/w --workers 16 --quiet > /dev/null
for r in 1 2; do rm -rf /tmp/o; echo "local 16 --no-certify: $($T python3 -m qwen_data pretrain $C -o /tmp/o/w --workers 16 --quiet --no-certify 2>&1)"; done
rm -rf /tmp/o; echo "local 16 certified: $($T python3 -m qwen_data pretrain $C -o /tmp/o/w --workers 16 --quiet 2>&1)"
FP=$(python3 -c "import json; print(json.load(open('/tmp/o/w.json'))['fingerprint'])"); echo "fingerprint $FP"
rm -rf /tmp/o /tmp/s; mkdir -p /tmp/s; S0=$(date +%s.%N)
for k in $(seq 0 15); do ( $T -o /tmp/s/t$k python3 -m qwen_data pretrain $C --shard $k/16 -o /tmp/s/$k --workers 0 --quiet --no-certify ) & done; wait
echo "16 separate processes: $(python3 -c "print(round($(date +%s.%N) - $S0, 2))") s; each: $(cat /tmp/s/t* | tr '\n' ' ')"
rm -rf /tmp/s
python3 -m ray.scripts.scripts start --head --num-cpus 16 --include-dashboard=false --disable-usage-stats > /dev/null 2>&1
for n in 16 32 64; do
  rm -rf /tmp/o; echo "ray joined $n shards --no-certify: $(RAY_ADDRESS=auto $T python3 -m qwen_data pretrain $C -o /tmp/o/r --executor ray --ray-shards $n --no-certify 2>&1 | grep -E "^ray|_s_|rror" | tr '\n' '|')"
done
rm -rf /tmp/o; echo "ray joined 16 certified: $(RAY_ADDRESS=auto $T python3 -m qwen_data pretrain $C -o /tmp/o/r --executor ray --ray-shards 16 2>&1 | grep -E "^ray|_s_|rror" | tr '\n' '|')"
python3 -c "import json; print('same fingerprint', json.load(open('/tmp/o/r.json'))['fingerprint'] == '$FP')"
python3 -m ray.scripts.scripts stop > /dev/null 2>&1
