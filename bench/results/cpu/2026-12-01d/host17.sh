#!/usr/bin/env bash
# A/B: the checking processes at nice 10 against the default, and --no-certify; SFT 1 GB chats and pretrain 2 GB.
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
T=$(python3 -c "
import sys; sys.path.insert(0, 'bench'); import corpora
print(corpora.unique_corpus('text-unique-2000MB.jsonl', corpora.text_corpus(), 2000_000_000))" | tail -1)
WAYS=no-certify,certified,niced python3 .cpu18/ab.py $C .cpu18/qwen2.5-instruct.jinja ${ROUNDS:-6} 2>&1 | grep -E "^[0-9] |median" > $OUT/ab-nice-sft.log
tail -3 $OUT/ab-nice-sft.log
JOB=pretrain WAYS=no-certify,certified,niced python3 .cpu18/ab.py $T x ${ROUNDS:-6} 2>&1 | grep -E "^[0-9] |median" > $OUT/ab-nice-pretrain.log
tail -3 $OUT/ab-nice-pretrain.log
