#!/usr/bin/env bash
# One fresh 16-core host: where a 16-worker packed SFT run's wall and CPU go. Per process (main, checking processes,
# workers: CPU, peak RSS, first and last seen, `procs.py`) and the run's phases (`marks.py`), on 2 GB of chats and of
# alpaca records that never repeat: certified, --no-certify, spelled only, certified with one checking process,
# certified in 8 MB chunks; one worker beside; py-spy of the main process (--gil) and of the whole tree.
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
python3 -m pip install -q --no-index --no-deps .whl/*.whl .cpus/*.whl 2>&1 | grep -v WARN | tail -2
python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2
python3 setup.py build_ext --inplace > /dev/null 2>&1
mkdir -p $QWEN_DATA_BENCH_CACHE && tar -C $QWEN_DATA_BENCH_CACHE -xJf .cpuc/cache.tar.xz
cp .cpuc/qwen2.5-instruct.jinja /tmp/
T0=$(date +%s)
(cd bench && python3 -c "
import corpora
corpora.unique_sft_corpus('chat', 2000 * 1_000_000)
corpora.unique_sft_corpus('alpaca', 2000 * 1_000_000)
" 2>&1 | tail -1)
echo "corpora $(( $(date +%s) - T0 )) s"; nproc; lscpu | grep -i "model name"
C=$QWEN_DATA_BENCH_CACHE/certify/chat-unique-2000MB.jsonl
A=$QWEN_DATA_BENCH_CACHE/certify/alpaca-unique-2000MB.jsonl
J="--reference-template /tmp/qwen2.5-instruct.jinja"
S="sft --template qwen2p5 --pack --seq-length 4096 --quiet -o /tmp/o/x"
R=$OUT/runs.jsonl
go() { label=$1; shift; python3 .cpus/procs.py "$label" python3 .cpus/marks.py "$@" >> $R; }
head -n 2000 $C > /tmp/head.jsonl; go warm $S /tmp/head.jsonl $J --workers 1
for r in 1 2; do
  go chat-cert16 $S $C $J --workers 16
  go chat-nocert16 $S $C --no-certify --workers 16
  QD_SPELLONLY=1 go chat-spelled16 $S $C $J --workers 16
  QD_CHECKERS=1 go chat-cert16-1checker $S $C $J --workers 16
  go chat-cert16-chunk8 $S $C $J --workers 16 --chunk-mb 8
done
go chat-cert1 $S $C $J --workers 1
go alpaca-cert16 $S $A $J --workers 16
go alpaca-nocert16 $S $A --no-certify --workers 16
go alpaca-cert1 $S $A $J --workers 1
go alpaca-cert16 $S $A $J --workers 16
timeout 60 py-spy record --gil -r 200 -f raw -o $OUT/spy-main-gil.txt -- python3 -m qwen_data $S $C $J --workers 16 2>&1 | tail -1
timeout 90 py-spy record --subprocesses -r 50 -f raw -o $OUT/spy-all.txt -- python3 -m qwen_data $S $C $J --workers 16 2>&1 | tail -1
echo "all $(( $(date +%s) - T0 )) s"
