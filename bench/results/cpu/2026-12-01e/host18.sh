#!/usr/bin/env bash
# A/B on a 16-core host: certified with the four-token spelling loop (AVX-512) against the token-by-token one,
# and --no-certify; SFT 1 GB chats and pretrain 2 GB, both never repeating.
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v WARN | tail -2;
  python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2; }
python3 setup.py build_ext --inplace > /dev/null 2>&1
grep -m1 "model name" /proc/cpuinfo; grep -m1 flags /proc/cpuinfo | tr ' ' '\n' | grep -c avx512_vbmi2
python3 -c "from qwen_data import _native; print('spelling loop', _native.spelling_path())"
mkdir -p $QWEN_DATA_BENCH_CACHE && [ -f $QWEN_DATA_BENCH_CACHE/chats.jsonl ] || tar -C $QWEN_DATA_BENCH_CACHE -xzf .cpu18/cache.tar.gz
python3 .cpu18/loop.py 2>&1 | tail -2 | tee $OUT/spelling-loop.log
C=$(python3 -c "
import sys; sys.path.insert(0, 'bench'); import corpora
print(corpora.unique_sft_corpus('chat', 1000_000_000))" | tail -1)
T=$(python3 -c "
import sys; sys.path.insert(0, 'bench'); import corpora
print(corpora.unique_corpus('text-unique-2000MB.jsonl', corpora.text_corpus(), 2000_000_000))" | tail -1)
WAYS=no-certify,certified,scalar python3 .cpu18/ab.py $C .cpu18/qwen2.5-instruct.jinja ${ROUNDS:-4} 2>&1 | grep -E "^[0-9] |median" > $OUT/ab-loop-sft.log
tail -3 $OUT/ab-loop-sft.log
JOB=pretrain WAYS=no-certify,certified,scalar python3 .cpu18/ab.py $T x ${ROUNDS:-4} 2>&1 | grep -E "^[0-9] |median" > $OUT/ab-loop-pretrain.log
tail -3 $OUT/ab-loop-pretrain.log
