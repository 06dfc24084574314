#!/usr/bin/env bash
# bench/cores.py as issue 59 names it, on the corpora host24.sh made: pretrain on 6 GB, packed SFT chats and alpaca
# on 2 GB each, none repeating, certified, at 1 and 16 workers, the ceiling measured in the same call (44df858+).
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v WARN | tail -2;
  python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2; }
python3 setup.py build_ext --inplace > /dev/null 2>&1
mkdir -p $QWEN_DATA_BENCH_CACHE && [ -f $QWEN_DATA_BENCH_CACHE/chats.jsonl ] || tar -C $QWEN_DATA_BENCH_CACHE -xzf .cpu18/cache.tar.gz
T0=$(date +%s)
timeout 570 python3 bench/cores.py --unique --corpus-mb 6000 --sft-mb 2000 --workers 1,16 \
  --jobs pretrain,sft-chat,sft-alpaca --reference-template .cpu18/qwen2.5-instruct.jinja --out $OUT/cores.json \
  > $OUT/cores.log 2>&1
echo "cores rc $? $(( $(date +%s) - T0 )) s"
tail -14 $OUT/cores.log
