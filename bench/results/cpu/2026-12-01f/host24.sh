#!/usr/bin/env bash
# Builds the corpora host25.sh measures on (6 GB of text, 2 GB each of chats and alpaca, none repeating; the
# 6 GB repeated text beside), then the A/B of 44df858 against 53a9fd2 on 1 GB of packed chats (no change expected).
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v WARN | tail -2;
  python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2; }
python3 setup.py build_ext --inplace > /dev/null 2>&1
(cd .cpu18/old && python3 setup.py build_ext --inplace > /dev/null 2>&1)
mkdir -p $QWEN_DATA_BENCH_CACHE && [ -f $QWEN_DATA_BENCH_CACHE/chats.jsonl ] || tar -C $QWEN_DATA_BENCH_CACHE -xzf .cpu18/cache.tar.gz
T0=$(date +%s)
cd bench && python3 -c "
import corpora
corpora.scaled_text_corpus(6000 * 1_000_000)
corpora.unique_corpus('text-unique-6000MB.jsonl', corpora.text_corpus(), 6000 * 1_000_000)
corpora.unique_sft_corpus('chat', 2000 * 1_000_000)
corpora.unique_sft_corpus('alpaca', 2000 * 1_000_000)
corpora.unique_sft_corpus('chat', 1000 * 1_000_000)
" 2>&1 | tail -3; cd ..
sync
echo "corpora $(( $(date +%s) - T0 )) s"; ls -la $QWEN_DATA_BENCH_CACHE/certify/ $QWEN_DATA_BENCH_CACHE/scaled/
left=$(( 560 - ($(date +%s) - T0) ))
[ $left -gt 60 ] && JOB=sft timeout $left python3 .cpu18/ab2.py $QWEN_DATA_BENCH_CACHE/certify/chat-unique-1000MB.jsonl .cpu18/qwen2.5-instruct.jinja 2 > $OUT/ab-json-sft.log 2>&1
tail -4 $OUT/ab-json-sft.log
