#!/usr/bin/env bash
# A fresh machine: qwen-data's wheels; 2 GB of text that never repeats; then pretrain at 16 workers, certified and
# --no-certify alternating (bench/measure.py: the main process's threads, the children running second by second),
# and once each with every process's CPU (percpu.py): where the certificate's cost goes.
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v WARN | tail -2
python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2
python3 setup.py build_ext --inplace > /dev/null 2>&1
mkdir -p $QWEN_DATA_BENCH_CACHE && tar -C $QWEN_DATA_BENCH_CACHE -xzf .cpu19/cache.tar.gz
cd bench && python3 -c "
import corpora
corpora.unique_corpus('text-unique-2000MB.jsonl', corpora.text_corpus(), 2000 * 1_000_000)
" 2>&1 | tail -1; cd ..
C=$QWEN_DATA_BENCH_CACHE/certify/text-unique-2000MB.jsonl
python3 -m qwen_data pretrain $QWEN_DATA_BENCH_CACHE/text.jsonl -o /tmp/w/w --quiet > /dev/null 2>&1
for round in 1 2; do
  for args in "" "--no-certify"; do
    rm -rf /tmp/o; echo "== pretrain 2 GB, 16 workers [$args]"
    python3 bench/measure.py -- python3 -m qwen_data pretrain $C -o /tmp/o/p --workers 16 --quiet $args 2>&1 | tail -12
  done
done
for args in "" "--no-certify"; do
  rm -rf /tmp/o; echo "== every process's CPU s [$args]"
  python3 .cpu19/percpu.py python3 -m qwen_data pretrain $C -o /tmp/o/p --workers 16 --quiet $args 2>&1
done
