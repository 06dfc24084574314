#!/usr/bin/env bash
# Call 3, right after hostI.sh on the same host (its corpora and wheels): a certified 16-worker packed SFT run on
# 2 GB with its two checking processes (the default) and with one (`QD_CHECKERS=1`), interleaved, three rounds
# each, chats and alpaca; each run's processes and phases (`procs.py`, `marks.py` of 2026-12-03b, carried in .cpus).
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -c "import orjson, gigatoken, psutil" 2>/dev/null || { echo "not the machine of hostH.sh"; exit 3; }
C=$QWEN_DATA_BENCH_CACHE/certify/chat-unique-2000MB.jsonl
A=$QWEN_DATA_BENCH_CACHE/certify/alpaca-unique-2000MB.jsonl
J="--reference-template /tmp/qwen2.5-instruct.jinja"
S="sft --template qwen2p5 --pack --seq-length 4096 --quiet"
R=$OUT/checkers.jsonl
go() { label=$1; shift; rm -rf /tmp/o; python3 .cpus/procs.py "$label" python3 .cpus/marks.py "$@" >> $R; }
T0=$(date +%s)
for r in 1 2 3; do
  go chat-2checkers $S -o /tmp/o/x $C $J --workers 16
  QD_CHECKERS=1 go chat-1checker $S -o /tmp/o/x $C $J --workers 16
  QD_CHECKERS=1 go alpaca-1checker $S -o /tmp/o/x $A $J --workers 16
  go alpaca-2checkers $S -o /tmp/o/x $A $J --workers 16
done
echo "all $(( $(date +%s) - T0 )) s"
python3 .cpus/table.py $R | cut -c1-200
