#!/usr/bin/env bash
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v WARN | tail -2;
  python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2; }
python3 setup.py build_ext --inplace > /dev/null 2>&1
mkdir -p $QWEN_DATA_BENCH_CACHE && [ -f $QWEN_DATA_BENCH_CACHE/chats.jsonl ] || tar -C $QWEN_DATA_BENCH_CACHE -xzf .cpu18/cache.tar.gz
C=$(python3 -c "
import sys; sys.path.insert(0, 'bench'); import corpora
print(corpora.unique_sft_corpus('chat', 1000_000_000))" | tail -1)
python3 .cpu18/ab.py $C .cpu18/qwen2.5-instruct.jinja ${ROUNDS:-6} 2>&1 | tee $OUT/ab-checkers.log | tail -4
