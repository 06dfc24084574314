#!/usr/bin/env bash
# After a713d8f, part 1 of 3: qwen-data's wheels installed; 8 GB of text that never repeats.
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v WARN | tail -2
python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2
python3 setup.py build_ext --inplace > /dev/null 2>&1
mkdir -p $QWEN_DATA_BENCH_CACHE && tar -C $QWEN_DATA_BENCH_CACHE -xzf .cpu19/cache.tar.gz
T0=$(date +%s)
cd bench && python3 -c "
import corpora
corpora.unique_corpus('text-unique-8000MB.jsonl', corpora.text_corpus(), 8000 * 1_000_000)
" 2>&1 | tail -1; cd ..
echo "corpus $(( $(date +%s) - T0 )) s"
