#!/usr/bin/env bash
# Ray joined against 16 local workers on one 16-core host, with Ray's own share measured after each pair
# (`bench/cores.py`'s `ray_floor`), on 8 GB and then on 16 GB of text that never repeats. Calls back to back:
#   hostR.sh prepare   (carry .whl .cpuray1 .cpuc)  qwen-data's wheels; the first third of Ray's wheel kept in /tmp;
#                                                   the bench cache unpacked; 8 GB of text that never repeats made
#   hostR.sh ray 8000  (carry .cpuray2)             Ray 2.60.0 installed; cores.py: one run of 16 local workers,
#                                                   then three pairs (16 local workers, Ray joined at 16 shards to
#                                                   a cluster started just before, Ray's own share on a fresh one)
#   hostR.sh corpus 16000                           the 8 GB corpus removed (the disk), 16 GB made
#   hostR.sh ray 16000                              as above, on 16 GB
# Then, on a second host (the 16 GB tail: writeback.py):
#   hostR.sh prepare 16000 (carry .whl .cpuray1 .cpuc)  as above, 16 GB made
#   hostR.sh writeback 16000 (carry .cpuray2)           Ray installed; writeback.py, two rounds
set -u
unset PYTHONDONTWRITEBYTECODE
export QWEN_DATA_BENCH_CACHE=/tmp/qwen-data-bench PYTHONWARNINGS=ignore
T0=$(date +%s)
corpus() {
  (cd bench && timeout 500 python3 -c "
import corpora, sys, time
t = time.time()
corpora.unique_corpus(f'text-unique-{sys.argv[1]}MB.jsonl', corpora.text_corpus(), int(sys.argv[1]) * 1_000_000)
print('text', sys.argv[1], 'MB made in', round(time.time() - t), 's', flush=True)
" "$1") 2>&1 | tail -3
  sync
}
case "$1" in
prepare)
  python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v WARN | tail -2
  python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2
  python3 setup.py build_ext --inplace > /dev/null 2>&1
  mkdir -p /tmp/ray && cp .cpuray1/raypart.00 /tmp/ray/ && echo "kept"
  mkdir -p $QWEN_DATA_BENCH_CACHE && tar -C $QWEN_DATA_BENCH_CACHE -xJf .cpuc/cache.tar.xz
  corpus ${2:-8000}
  nproc; df -h /tmp | tail -1 ;;
corpus)
  rm -f $QWEN_DATA_BENCH_CACHE/certify/text-unique-*
  corpus "$2"
  df -h /tmp | tail -1 ;;
ray|writeback)
  [ -f /tmp/ray/raypart.00 ] || { echo "not hostR.sh prepare's machine"; exit 3; }
  if ! python3 -c "import ray" 2>/dev/null; then
    W=/tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
    cat /tmp/ray/raypart.00 .cpuray2/raypart.01 .cpuray2/raypart.02 > $W
    python3 -m pip install -q --no-index --find-links .cpuray2 $W 2>&1 | grep -v WARN | tail -3
  fi
  mkdir -p /tmp/cores
  if [ "$1" = writeback ]; then
    df -h /dev/shm | tail -1
    if [ "$(df --output=avail -B1G /dev/shm | tail -1)" -lt 40 ]; then  # (a container's 64 MB /dev/shm)
      mkdir -p /tmp/shm && mount -t tmpfs -o size=48g tmpfs /tmp/shm && export WRITEBACK_MEMORY=/tmp/shm
      df -h /tmp/shm | tail -1
    fi
    (cd bench && timeout 560 python3 results/cpu/2026-12-03g/writeback.py \
      $QWEN_DATA_BENCH_CACHE/certify/text-unique-$2MB.jsonl 2 /tmp/cores/writeback-$2MB.json) 2>&1 | tail -12
    cp /tmp/cores/writeback* $OUT/; echo "$1: $(( $(date +%s) - T0 )) s"; exit 0
  fi
  (cd bench && timeout 560 python3 cores.py --unique --no-repeated --corpus-mb "$2" --workers 16 --jobs pretrain \
    --out /tmp/cores/cores-$2MB.json --ray --ray-joined-only --ray-shards 16 --ray-rounds 3) 2>&1 \
    | tee -a /tmp/cores/cores-$2MB.log | tail -14
  cp /tmp/cores/* $OUT/ ;;
esac
echo "$1: $(( $(date +%s) - T0 )) s"
