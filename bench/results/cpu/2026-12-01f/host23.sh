#!/usr/bin/env bash
# The jsonl fast path (44df858) on a 16-core host: bench/cores.py pretrain at 1 and 16 workers on 2 GB that never
# repeats, certified, with the host's share-nothing ceiling; then 16 workers against 53a9fd2 (.cpu18/old), 3 rounds.
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v WARN | tail -2;
  python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2; }
python3 setup.py build_ext --inplace > /dev/null 2>&1
(cd .cpu18/old && python3 setup.py build_ext --inplace > /dev/null 2>&1)
mkdir -p $QWEN_DATA_BENCH_CACHE && [ -f $QWEN_DATA_BENCH_CACHE/chats.jsonl ] || tar -C $QWEN_DATA_BENCH_CACHE -xzf .cpu18/cache.tar.gz
T0=$(date +%s)
timeout 330 python3 bench/cores.py --unique --corpus-mb 2000 --workers 1,16 --jobs pretrain \
  --out $OUT/cores-pretrain.json > $OUT/cores-pretrain.log 2>&1
echo "cores rc $? $(( $(date +%s) - T0 )) s"
tail -8 $OUT/cores-pretrain.log
C=$(ls $QWEN_DATA_BENCH_CACHE/certify/text-unique-2000MB.jsonl 2>/dev/null || ls $QWEN_DATA_BENCH_CACHE/*/text-unique-2000MB.jsonl | head -1)
echo "corpus $C"
JOB=pretrain timeout $(( 560 - ($(date +%s) - T0) )) python3 .cpu18/ab2.py $C none 3 > $OUT/ab-json.log 2>&1
echo "ab rc $?"; tail -4 $OUT/ab-json.log
