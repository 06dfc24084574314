#!/usr/bin/env bash
# The same warm host, second call: SFT's layers on 1 GB of chats that never repeat, then pretraining's again.
set -u
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken" 2>/dev/null || { python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v WARN | tail -2;
  python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2; }
python3 setup.py build_ext --inplace > /dev/null 2>&1
T0=$(date +%s); J=.cpu18/qwen2.5-instruct.jinja
C=/tmp/qwen-data-bench/certify/chat-unique-1000MB.jsonl; ls -la $C | tee $OUT/host2.txt
timeout 200 python3 bench/certify.py --layers $C --sft --workers 16 --rounds 3 --reference-template $J \
  --json $OUT/layers-sft-1g.json > $OUT/layers-sft.log 2>&1
echo "layers sft rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/host2.txt
T=/tmp/qwen-data-bench/certify/text-unique-6000MB.jsonl
timeout 200 python3 bench/certify.py --layers $T --workers 16 --rounds 2 --json $OUT/layers-pretrain-6g-b.json \
  > $OUT/layers-pretrain-b.log 2>&1
echo "layers pretrain rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/host2.txt
cat $OUT/layers-*.log | grep -E "round|Error"
