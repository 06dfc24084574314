#!/usr/bin/env bash
# Call 1 of 4 on one fresh host (carry .whl .cpuray1 .cpuc): qwen-data's wheels; the first third of Ray's wheel and
# the official Jinja kept in /tmp; the corpora of hostN.sh made: 8 GB of text that never repeats, the bench text
# repeated to 8 GB, 4 GB each of chats and of alpaca records that never repeat.
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v WARN | tail -2
python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2
python3 setup.py build_ext --inplace > /dev/null 2>&1
mkdir -p /tmp/ray && cp .cpuray1/raypart.00 /tmp/ray/ && cp .cpuc/qwen2.5-instruct.jinja /tmp/ && echo "kept"
mkdir -p $QWEN_DATA_BENCH_CACHE && tar -C $QWEN_DATA_BENCH_CACHE -xJf .cpuc/cache.tar.xz
T0=$(date +%s)
cd bench && timeout 540 python3 -c "
import corpora, time
t = time.time()
corpora.unique_corpus('text-unique-8000MB.jsonl', corpora.text_corpus(), 8000 * 1_000_000); print('text', round(time.time() - t), flush=True)
for kind in ('chat', 'alpaca'):
    corpora.unique_sft_corpus(kind, 4000 * 1_000_000); print(kind, round(time.time() - t), flush=True)
corpora.scaled_text_corpus(8000 * 1_000_000); print('repeated', round(time.time() - t), flush=True)
" 2>&1 | tail -5; cd ..
sync
echo "corpora $(( $(date +%s) - T0 )) s"
ls -la $QWEN_DATA_BENCH_CACHE/certify $QWEN_DATA_BENCH_CACHE/scaled; nproc; df -h /tmp | tail -1
