#!/usr/bin/env bash
# Session 2026-12-01: a 32-core host: cores.py --unique (pretrain at 1, 16, 32 workers, certified), then certified
# against --no-certify at 16 and 32 workers, ROUNDS rounds, order flipped each round.
set -u
unset PYTHONDONTWRITEBYTECODE
ROUNDS=${1:-2}
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v WARN | tail -2
python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
mkdir -p $QWEN_DATA_BENCH_CACHE && tar -C $QWEN_DATA_BENCH_CACHE -xzf .cpu17/cache.tar.gz
{ grep -m1 "model name" /proc/cpuinfo; nproc; free -g | head -2; } | tee $OUT/host.txt
T0=$(date +%s); R=$(pwd)
timeout 300 python3 bench/cores.py --unique --corpus-mb 2000 --workers 1,16,32 --jobs pretrain \
  --out $OUT/cores-unique-32b.json > $OUT/cores.log 2>&1
echo "cores rc $? $(( $(date +%s) - T0 )) s" | tee -a $OUT/host.txt
cd bench && python3 -c "
import corpora
print('PATH', corpora.unique_corpus('text-unique-2000MB.jsonl', corpora.text_corpus(), 2_000_000_000))
print('PATH', corpora.scaled_sft_corpus('chat', 1_000_000_000))
" | grep "^PATH " | cut -c6- > /tmp/corpora.txt && cd .. && sync && cat /tmp/corpora.txt
echo "corpora $(( $(date +%s) - T0 )) s" | tee -a $OUT/host.txt
T=$(sed -n 1p /tmp/corpora.txt); C=$(sed -n 2p /tmp/corpora.txt)
W=/tmp/ab
SFT="--template qwen2p5 --pack --seq-length 4096 --reference-template $R/.cpu17/qwen2.5-instruct.jinja"
python3 -m qwen_data sft $C $SFT -o $W/warm2 --workers 16 >/dev/null 2>&1; rm -rf $W
run() {  # NAME WORKERS ARGS...
  local name=$1 n=$2; shift 2; rm -rf $W
  echo "== $name $(python3 $R/.cpu17/cpu2.py python3 -m qwen_data "$@" -o $W/p --workers $n | tr '\n' ' ') $(python3 -c "import json; m = json.load(open('$W/p.json')); print('certified', m['certificate'].get('certified'), m['certificate'].get('records_checked'), m['fingerprint'][:24], m['tokens'])" 2>&1 | tail -1)"
}
pair() {  # NAME WORKERS ARGS... : certified and not, in the round's order
  local name=$1 n=$2; shift 2
  if [ $((r % 2)) = 1 ]; then run $name-cert $n "$@"; run $name-nocert $n "$@" --no-certify
  else run $name-nocert $n "$@" --no-certify; run $name-cert $n "$@"; fi
}
for r in $(seq $ROUNDS); do
  pair pretrain16 16 pretrain $T; pair chats16 16 sft $C $SFT; pair pretrain32 32 pretrain $T; pair chats32 32 sft $C $SFT
done 2>&1 | tee $OUT/cost17.log
echo "done $(( $(date +%s) - T0 )) s" | tee -a $OUT/host.txt
