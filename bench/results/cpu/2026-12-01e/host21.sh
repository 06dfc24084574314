#!/usr/bin/env bash
# One-document pretrain on an empty cache folder (a fresh machine's first run) and on the cache it left, certified
# and not, three rounds: this stop's final tree.
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v WARN | tail -2;
  python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2; }
python3 setup.py build_ext --inplace > /dev/null 2>&1
mkdir -p $QWEN_DATA_BENCH_CACHE && [ -f $QWEN_DATA_BENCH_CACHE/chats.jsonl ] || tar -C $QWEN_DATA_BENCH_CACHE -xzf .cpu18/cache.tar.gz
head -n 1 $QWEN_DATA_BENCH_CACHE/text.jsonl > /tmp/one.jsonl
python3 -m qwen_data pretrain /tmp/one.jsonl --quiet -o /tmp/o0/p > /dev/null  # (bytecode compiled once)
for r in 1 2 3; do
  for way in no-certify certified; do
    extra=$([ $way = no-certify ] && echo --no-certify)
    rm -rf /tmp/xc /tmp/o1; export XDG_CACHE_HOME=/tmp/xc
    /usr/bin/time -f "one-doc $way cold %e s %U+%S" python3 -m qwen_data pretrain /tmp/one.jsonl --quiet $extra -o /tmp/o1/p > /dev/null
    rm -rf /tmp/o1; /usr/bin/time -f "one-doc $way warm %e s %U+%S" python3 -m qwen_data pretrain /tmp/one.jsonl --quiet $extra -o /tmp/o1/p > /dev/null
    unset XDG_CACHE_HOME
  done
done 2>&1 | grep one-doc | tee $OUT/one-doc-final.log
