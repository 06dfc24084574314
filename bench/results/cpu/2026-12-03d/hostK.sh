#!/usr/bin/env bash
# Call 1 of 2 (then hostL.sh) on one fresh host: qwen-data's wheels; 8 GB of text that never repeats; the first
# third of Ray's wheel kept in /tmp.
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v WARN | tail -2
python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2
python3 setup.py build_ext --inplace > /dev/null 2>&1
mkdir -p /tmp/ray && cp .cpuray1/raypart.00 /tmp/ray/ && echo "ray: first third kept"
mkdir -p $QWEN_DATA_BENCH_CACHE && tar -C $QWEN_DATA_BENCH_CACHE -xJf .cpuc/cache.tar.xz
T0=$(date +%s)
cd bench && timeout 400 python3 -c "
import corpora
corpora.unique_corpus('text-unique-8000MB.jsonl', corpora.text_corpus(), 8000 * 1_000_000)
" 2>&1 | tail -1; cd ..
sync
echo "corpora $(( $(date +%s) - T0 )) s"
ls -la $QWEN_DATA_BENCH_CACHE/certify; nproc; df -h /tmp | tail -1
