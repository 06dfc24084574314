#!/usr/bin/env bash
# One call on a fresh host (carry .whl .cpuc), after BATCH_AFTER's change: packed alpaca on 4 GB that never repeats,
# 1 and 16 workers (three runs), certified against the official Jinja: the 16 workers' summed RSS against 4 GiB.
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v WARN | tail -2
python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2
python3 setup.py build_ext --inplace > /dev/null 2>&1
cp .cpuc/qwen2.5-instruct.jinja /tmp/
mkdir -p $QWEN_DATA_BENCH_CACHE /tmp/cores && tar -C $QWEN_DATA_BENCH_CACHE -xJf .cpuc/cache.tar.xz
T0=$(date +%s)
(cd bench && timeout 540 python3 cores.py --unique --no-repeated --corpus-mb 200 --sft-mb 4000 --workers 1,16 \
  --jobs sft-alpaca --rounds 3 --reference-template /tmp/qwen2.5-instruct.jinja --out /tmp/cores/cores-alpaca.json) \
  2>&1 | tee /tmp/cores/cores-alpaca.log | tail -8
echo "alpaca: $(( $(date +%s) - T0 )) s"
cp /tmp/cores/* $OUT/
