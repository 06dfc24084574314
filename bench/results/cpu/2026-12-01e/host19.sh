#!/usr/bin/env bash
# Timelines (trace.py: busy cores per 0.1 s, each process's span and CPU) of SFT 1 GB chats and pretrain 2 GB at 16
# workers, certified and --no-certify, two of each, interleaved.
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
SFT="sft $C --template qwen2p5 --pack --seq-length 4096 --workers 16 --quiet"
for r in 1 2; do
  for way in no-certify certified; do
    extra=$([ $way = no-certify ] && echo --no-certify || echo "--reference-template .cpu18/qwen2.5-instruct.jinja")
    rm -rf /tmp/t; python3 .cpu18/trace.py python3 -m qwen_data $SFT $extra -o /tmp/t/c 2> $OUT/trace-sft-$way-$r.log
    rm -rf /tmp/t; python3 .cpu18/trace.py python3 -m qwen_data pretrain $T --workers 16 --quiet \
      $([ $way = no-certify ] && echo --no-certify) -o /tmp/t/p 2> $OUT/trace-pretrain-$way-$r.log
  done
done
grep -h "TRACE wall" $OUT/trace-*.log
