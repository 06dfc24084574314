#!/usr/bin/env bash
# A fresh machine: qwen-data's wheels; 2 GB of chats that never repeat; then Pai's packed rows at 16 workers, 9076c40
# (.cpubase: rows laid out and hashed by the main process) against this checkout (by the workers), ab.py.
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v WARN | tail -2
python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2
python3 setup.py build_ext --inplace > /dev/null 2>&1
cp qwen_data/_native*.so .cpubase/qwen_data/
mkdir -p $QWEN_DATA_BENCH_CACHE && tar -C $QWEN_DATA_BENCH_CACHE -xzf .cpu19/cache.tar.gz
cd bench && python3 -c "
import corpora
corpora.unique_sft_corpus('chat', 2000 * 1_000_000)
" 2>&1 | tail -1; cd ..
T=.cpu19/qwen2.5-instruct.jinja
python3 -m qwen_data sft $QWEN_DATA_BENCH_CACHE/chats.jsonl --template qwen2p5 -o /tmp/w/w --quiet --reference-template $T > /dev/null 2>&1
timeout 400 python3 bench/results/cpu/2026-12-02/ab.py $QWEN_DATA_BENCH_CACHE/certify/chat-unique-2000MB.jsonl 16 ${ROUNDS:-2} $T \
  $OUT/ab-chat-pai${SUFFIX:-}.jsonl --layout pai 2>&1 | grep -v "^rejected\|more rejected"
