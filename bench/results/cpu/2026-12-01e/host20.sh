#!/usr/bin/env bash
# The main process's phases (phases.py) of SFT 1 GB chats and pretrain 2 GB at 16 workers, certified and not, two
# rounds; then one-document runs on an empty cache (a fresh machine's first run) and a warm one, certified and not.
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v WARN | tail -2;
  python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2; }
python3 setup.py build_ext --inplace > /dev/null 2>&1
mkdir -p $QWEN_DATA_BENCH_CACHE && [ -f $QWEN_DATA_BENCH_CACHE/chats.jsonl ] || tar -C $QWEN_DATA_BENCH_CACHE -xzf .cpu18/cache.tar.gz
head -n 1 $QWEN_DATA_BENCH_CACHE/text.jsonl > /tmp/one.jsonl
for r in 1 2 3; do
  for way in no-certify certified; do
    extra=$([ $way = no-certify ] && echo --no-certify)
    rm -rf /tmp/xc /tmp/o1; export XDG_CACHE_HOME=/tmp/xc
    /usr/bin/time -f "one-doc $way cold %e s %U+%S" python3 -m qwen_data pretrain /tmp/one.jsonl --quiet $extra -o /tmp/o1/p > /dev/null
    rm -rf /tmp/o1; /usr/bin/time -f "one-doc $way warm %e s %U+%S" python3 -m qwen_data pretrain /tmp/one.jsonl --quiet $extra -o /tmp/o1/p > /dev/null
    unset XDG_CACHE_HOME
  done
done 2>&1 | grep one-doc | tee $OUT/one-doc.log
C=$(python3 -c "
import sys; sys.path.insert(0, 'bench'); import corpora
print(corpora.unique_sft_corpus('chat', 1000_000_000))" | tail -1)
T=$(python3 -c "
import sys; sys.path.insert(0, 'bench'); import corpora
print(corpora.unique_corpus('text-unique-2000MB.jsonl', corpora.text_corpus(), 2000_000_000))" | tail -1)
for r in 1 2 3; do
  for way in no-certify certified; do
    extra=$([ $way = no-certify ] && echo --no-certify || echo "--reference-template .cpu18/qwen2.5-instruct.jinja")
    rm -rf /tmp/t; echo "== sft $way $r" >> $OUT/phases.log
    python3 .cpu18/phases.py sft $C --template qwen2p5 --pack --seq-length 4096 --workers 16 --quiet $extra -o /tmp/t/c 2>&1 | grep PHASE >> $OUT/phases.log
    rm -rf /tmp/t; echo "== pretrain $way $r" >> $OUT/phases.log
    python3 .cpu18/phases.py pretrain $T --workers 16 --quiet $([ $way = no-certify ] && echo --no-certify) -o /tmp/t/p 2>&1 | grep PHASE >> $OUT/phases.log
  done
done
grep -c PHASE $OUT/phases.log
