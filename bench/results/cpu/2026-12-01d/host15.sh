#!/usr/bin/env bash
# Warm host, third call: where a certified 16-worker SFT run's extra CPU goes, per process (trace.py), 1 GB chats.
set -u
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v WARN | tail -2;
  python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2; }
python3 setup.py build_ext --inplace > /dev/null 2>&1
mkdir -p $QWEN_DATA_BENCH_CACHE && [ -f $QWEN_DATA_BENCH_CACHE/chats.jsonl ] || tar -C $QWEN_DATA_BENCH_CACHE -xzf .cpu18/cache.tar.gz
C=$(python3 -c "
import sys; sys.path.insert(0, 'bench'); import corpora
print(corpora.unique_sft_corpus('chat', 1000_000_000))" | tail -1); J=.cpu18/qwen2.5-instruct.jinja
T=/tmp/qwen-data-bench/certify/text-unique-6000MB.jsonl
for r in 1 2; do
  for f in "--no-certify" "--reference-template $J"; do
    rm -rf /tmp/tr; echo "### sft $f"
    python3 .cpu18/trace.py python3 -m qwen_data sft $C --template qwen2p5 --pack --seq-length 4096 --workers 16 \
      -o /tmp/tr/c $f --quiet 2>&1 | grep -E "TRACE|certified"
  done
done > $OUT/trace-sft-16.log 2>&1
grep -E "TRACE wall|### " $OUT/trace-sft-16.log
