#!/usr/bin/env bash
# One call on a fresh host: qwen-data's wheels, then bench/cores.py on the SFT jobs alone (packed chats and alpaca
# on 2 GB each that never repeat, 1 and 16 workers, certified), the raw ceiling on 1 GB of text beside them.
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v WARN | tail -2
python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2
python3 setup.py build_ext --inplace > /dev/null 2>&1
mkdir -p $QWEN_DATA_BENCH_CACHE && tar -C $QWEN_DATA_BENCH_CACHE -xJf .cpuc/cache.tar.xz
cp .cpuc/qwen2.5-instruct.jinja /tmp/
T0=$(date +%s)
timeout 540 python3 bench/cores.py --unique --no-repeated --corpus-mb 1000 --sft-mb 2000 --workers 1,16 \
  --jobs sft-chat,sft-alpaca --reference-template /tmp/qwen2.5-instruct.jinja --out $OUT/cores-sft-2g.json \
  > $OUT/cores-sft.log 2>&1
echo "cores rc $? $(( $(date +%s) - T0 )) s"
tail -12 $OUT/cores-sft.log
