#!/usr/bin/env bash
# Session 2026-12-01: workers writing their own ids (da772c6+) against 026263d (the main process writes every id),
# pretrain certified on 2 GB never-repeating at 16 and 32 workers, interleaved; cores.py (ceilings) on the new tree.
set -u
unset PYTHONDONTWRITEBYTECODE
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v WARN | tail -2
python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2
python3 setup.py build_ext --inplace > /dev/null 2>&1
(cd .cpu17/old && python3 setup.py build_ext --inplace > /dev/null 2>&1); ls .cpu17/old/qwen_data/*.so
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
mkdir -p $QWEN_DATA_BENCH_CACHE && tar -C $QWEN_DATA_BENCH_CACHE -xzf .cpu17/cache.tar.gz
{ grep -m1 "model name" /proc/cpuinfo; nproc; } | tee $OUT/host.txt
T0=$(date +%s); R=$(pwd)
(cd bench && python3 -c "
import corpora
corpora.unique_corpus('text-unique-2000MB.jsonl', corpora.text_corpus(), 2_000_000_000)") && sync
echo "corpus $(( $(date +%s) - T0 )) s" | tee -a $OUT/host.txt
T=/tmp/qwen-data-bench/certify/text-unique-2000MB.jsonl; W=/tmp/ab
for tree in $R/.cpu17/old $R; do PYTHONPATH=$tree python3 -c "import qwen_data; print(qwen_data.__file__)" | tee -a $OUT/host.txt; done
run() {  # NAME TREE WORKERS
  rm -rf $W
  echo "== $1 $(PYTHONPATH=$2 python3 $R/.cpu17/cpu2.py python3 -m qwen_data pretrain $T -o $W/p --workers $3 | head -2 | tr '\n' ' ' | cut -c1-400) $(python3 -c "import json; m = json.load(open('$W/p.json')); print(m['certificate'].get('certified'), m['fingerprint'][:16])" 2>&1 | tail -1)"
}
for r in 1 2; do
  for w in 16 32; do
    if [ $((r % 2)) = 1 ]; then run old$w $R/.cpu17/old $w; run new$w $R $w; else run new$w $R $w; run old$w $R/.cpu17/old $w; fi
  done
done 2>&1 | tee $OUT/ab.log
echo "ab $(( $(date +%s) - T0 )) s" | tee -a $OUT/host.txt
[ $(( $(date +%s) - T0 )) -lt ${CORES_BEFORE:-150} ] && timeout 120 python3 bench/cores.py --unique --corpus-mb 2000 \
  --workers 16,32 --jobs pretrain --out $OUT/cores-unique-32d.json > $OUT/cores.log 2>&1
echo "done $(( $(date +%s) - T0 )) s" | tee -a $OUT/host.txt
