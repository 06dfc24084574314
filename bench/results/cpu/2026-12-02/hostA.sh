#!/usr/bin/env bash
# Part 1 of 2: qwen-data's wheels; 1 GB of text and 2 GB each of chats and alpaca records that never repeat; then
# packed SFT chats at 16 workers, the commit before (.cpubase) against this one, certified and not (ab.py).
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v WARN | tail -2
python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2
python3 setup.py build_ext --inplace > /dev/null 2>&1
cp qwen_data/_native*.so .cpubase/qwen_data/
mkdir -p $QWEN_DATA_BENCH_CACHE && tar -C $QWEN_DATA_BENCH_CACHE -xzf .cpu19/cache.tar.gz
T0=$(date +%s)
cd bench && timeout 380 python3 -c "
import corpora
corpora.unique_sft_corpus('chat', 2000 * 1_000_000)
corpora.unique_sft_corpus('alpaca', 2000 * 1_000_000)
corpora.unique_corpus('text-unique-1000MB.jsonl', corpora.text_corpus(), 1000 * 1_000_000)
" 2>&1 | tail -2; cd ..
echo "corpora $(( $(date +%s) - T0 )) s"; ls -la $QWEN_DATA_BENCH_CACHE/certify
T=.cpu19/qwen2.5-instruct.jinja
python3 -m qwen_data sft $QWEN_DATA_BENCH_CACHE/chats.jsonl --template qwen2p5 -o /tmp/w/w --quiet --reference-template $T > /dev/null 2>&1
left=$(( 560 - $(date +%s) + T0 ))
echo "A/B with ${left} s left"
timeout $left python3 bench/results/cpu/2026-12-02/ab.py $QWEN_DATA_BENCH_CACHE/certify/chat-unique-2000MB.jsonl 16 2 $T \
  $OUT/ab-chat.jsonl 2>&1 | grep -v "^rejected\|more rejected"
