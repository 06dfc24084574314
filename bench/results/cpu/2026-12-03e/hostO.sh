#!/usr/bin/env bash
# Call 4, right after hostN.sh sft (carry .cpuray2): Ray 2.60.0 installed; bench/cores.py --continue adds three
# pairs (16 local workers, then Ray joined at 16 shards to the cluster it starts) to the same cores.json.
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
[ -f /tmp/cores/cores.json ] && [ -f /tmp/ray/raypart.00 ] || { echo "not hostN.sh's machine"; exit 3; }
W=/tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
cat /tmp/ray/raypart.00 .cpuray2/raypart.01 .cpuray2/raypart.02 > $W
python3 -m pip install -q --no-index --find-links .cpuray2 $W 2>&1 | grep -v WARN | tail -3
T0=$(date +%s)
(cd bench && timeout 500 python3 cores.py --unique --no-repeated --corpus-mb 8000 --workers 16 --jobs pretrain \
  --continue --out /tmp/cores/cores.json --ray --ray-joined-only --ray-shards 16 --ray-rounds 3) 2>&1 \
  | tee -a /tmp/cores/cores.log | tail -12
echo "ray: $(( $(date +%s) - T0 )) s"
cp /tmp/cores/* $OUT/
