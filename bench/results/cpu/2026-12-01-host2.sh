#!/usr/bin/env bash
# Session 2026-12-01, second call: the 32-core host on a 6 GB never-repeating corpus (the fixed start and end of a run
# weigh less than on 2 GB): cores.py --unique at 16 and 32 workers, certified; then certified against --no-certify.
set -u
unset PYTHONDONTWRITEBYTECODE
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v WARN | tail -2
python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
mkdir -p $QWEN_DATA_BENCH_CACHE && tar -C $QWEN_DATA_BENCH_CACHE -xzf .cpu17/cache.tar.gz
{ grep -m1 "model name" /proc/cpuinfo; nproc; df -h /tmp | tail -1; } | tee $OUT/host.txt
T0=$(date +%s); R=$(pwd)
timeout 420 python3 bench/cores.py --unique --corpus-mb 6000 --workers 16,32 --jobs pretrain \
  --out $OUT/cores-unique-32c.json > $OUT/cores.log 2>&1
echo "cores rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/host.txt
T=/tmp/qwen-data-bench/certify/text-unique-6000MB.jsonl; W=/tmp/ab
run() {  # NAME WORKERS ARGS...
  local name=$1 n=$2; shift 2; rm -rf $W
  echo "== $name $(python3 $R/.cpu17/cpu2.py python3 -m qwen_data "$@" -o $W/p --workers $n | head -1) $(python3 -c "import json; m = json.load(open('$W/p.json')); print('certified', m['certificate'].get('certified'), m['certificate'].get('records_checked'), m['fingerprint'][:24], m['tokens'])" 2>&1 | tail -1)"
}
for r in 1 2; do
  if [ $r = 1 ]; then run p16-cert 16 pretrain $T; run p16-nocert 16 pretrain $T --no-certify
  else run p16-nocert 16 pretrain $T --no-certify; run p16-cert 16 pretrain $T; fi
  [ $(( $(date +%s) - T0 )) -gt 520 ] && break
done 2>&1 | tee $OUT/cost17b.log
echo "done $(( $(date +%s) - T0 )) s" | tee -a $OUT/host.txt
