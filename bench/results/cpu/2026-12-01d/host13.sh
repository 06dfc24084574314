#!/usr/bin/env bash
# 16-core host: where the certificate's cost lies at 16 workers (bench/certify.py --layers, the stub fixed), and
# pretraining's share of the host's share-nothing ceiling on 6 GB that never repeats, certified and not.
set -u
unset PYTHONDONTWRITEBYTECODE
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v WARN | tail -2
python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2
python3 setup.py build_ext --inplace > /dev/null 2>&1
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
mkdir -p $QWEN_DATA_BENCH_CACHE && tar -C $QWEN_DATA_BENCH_CACHE -xzf .cpu18/cache.tar.gz
{ grep -m1 "model name" /proc/cpuinfo; nproc; lscpu | grep -E "Thread|Core|Socket|L2|L3"; free -g | head -2; } | tee $OUT/host.txt
T0=$(date +%s)
J=.cpu18/qwen2.5-instruct.jinja
timeout 300 python3 bench/cores.py --unique --corpus-mb 6000 --workers 16 --jobs pretrain \
  --out $OUT/cores-unique-16-6g.json > $OUT/cores.log 2>&1
echo "cores rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/host.txt
T=/tmp/qwen-data-bench/certify/text-unique-6000MB.jsonl
timeout 150 python3 bench/certify.py --layers $T --workers 16 --rounds 2 --json $OUT/layers-pretrain-6g.json \
  > $OUT/layers-pretrain.log 2>&1
echo "layers pretrain rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/host.txt
if [ $(( $(date +%s) - T0 )) -lt 420 ]; then
  C=$(python3 -c "
import sys; sys.path.insert(0, 'bench'); import corpora
print(corpora.unique_sft_corpus('chat', 1000_000_000))" 2>>$OUT/host.txt)
  echo "chats $C $(( $(date +%s) - T0 )) s" | tee -a $OUT/host.txt
  timeout 120 python3 bench/certify.py --layers $C --sft --workers 16 --rounds 2 --reference-template $J \
    --json $OUT/layers-sft-1g.json > $OUT/layers-sft.log 2>&1
  echo "layers sft rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/host.txt
fi
cat $OUT/layers-*.log | grep round
