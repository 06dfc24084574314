#!/usr/bin/env bash
# A fresh machine: qwen-data's wheels; 2 GB each of chats and alpaca records that never repeat; then, at 16 workers,
# where each run's time goes (bench/measure.py: the main process's threads, the children running second by second):
# packed (as bench/cores.py runs SFT) against unpacked, certified, and packed --no-certify.
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v WARN | tail -2
python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2
python3 setup.py build_ext --inplace > /dev/null 2>&1
mkdir -p $QWEN_DATA_BENCH_CACHE && tar -C $QWEN_DATA_BENCH_CACHE -xzf .cpu19/cache.tar.gz
cd bench && python3 -c "
import corpora
corpora.unique_sft_corpus('chat', 2000 * 1_000_000)
corpora.unique_sft_corpus('alpaca', 2000 * 1_000_000)
" 2>&1 | tail -1; cd ..
T=.cpu19/qwen2.5-instruct.jinja
python3 -m qwen_data sft $QWEN_DATA_BENCH_CACHE/chats.jsonl --template qwen2p5 -o /tmp/w/w --quiet --reference-template $T > /dev/null 2>&1
for kind in chat alpaca; do
  C=$QWEN_DATA_BENCH_CACHE/certify/$kind-unique-2000MB.jsonl
  for args in "--pack --seq-length 4096" "" "--pack --seq-length 4096 --no-certify"; do
    rm -rf /tmp/o; echo "== $kind 16 workers [$args]"
    python3 bench/measure.py -- python3 -m qwen_data sft $C --template qwen2p5 $args --workers 16 -o /tmp/o/s --quiet \
      --reference-template $T 2>&1 | grep -v "^rejected\|more rejected\|^o/\|^template\|^[0-9]* records rejected" | tail -14
  done
done
