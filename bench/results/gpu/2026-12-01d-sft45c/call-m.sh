#!/usr/bin/env bash
# Call M (after calls 0-3 put .te/p0-p3 in /tmp/te): carry [".gpu08s"]. TE installed from .gpu08s/te4,
# megatron-core; the output projection's compiled backward, new path against megatron-core's (proj.py);
# packed SFT new/base interleaved (two rounds); the GPU tests.
set -u
cd "$(dirname "$0")/.."
LIMIT=${1:-270}; TAG=m; R=/tmp/o$TAG; rm -rf $R; mkdir -p $R
source .gpu08s/common.sh
nvidia-smi --query-gpu=name,uuid,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee $R/device.txt
mkdir -p /tmp/te && cp .gpu08s/te4/* /tmp/te/
bash /tmp/te/device-te.sh install 2>&1 | grep -v -E "WARN|Warning" | tail -4 | tee $R/te_install.log
python3 -m pip install -q --no-index --no-deps --no-compile .gpu08s/whl/*.whl .gpu08s/tc/*.whl 2>&1 | grep -v WARN | tail -2
python3 setup.py -q build_ext --inplace > $R/native.log 2>&1 || tail -5 $R/native.log
rm -rf .gpu $BASE/.gpu; ln -s $ROOT/.gpu08s/data .gpu; ln -s $ROOT/.gpu08s/data $BASE/.gpu
mkdir -p /tmp/pp && ln -sfn $ROOT/train /tmp/pp/qwen_data_train
{ python3 -c "import train, torch, transformer_engine as te, megatron.core as m; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), 'te', te.__version__, 'megatron-core', m.__version__, 'new', train.__file__)"
  (cd $BASE && python3 -c "import train; print('base', train.__file__)")
  git log -1 --format=%H; git status --short | head -20; } 2>&1 | grep -v -i warn | tee -a $R/device.txt
echo "installed at $SECONDS s" | tee -a $R/device.txt
PYTHONPATH=$PYTHONPATH:/tmp/pp TORCHINDUCTOR_CACHE_DIR=/tmp/ind-proj timeout 80 python3 bench/results/gpu/2026-12-01d-sft45c/proj.py 2>&1 | filt | grep -v -i warn > $R/proj.log
tail -14 $R/proj.log; echo "proj done at $SECONDS s" | tee -a $R/device.txt
pack
rate sft45c-sft-a new $SFT
rate sft45c-sft-base-a base $SFT
rate sft45c-sft-b new $SFT
rate sft45c-sft-base-b base $SFT
echo "rates done at $SECONDS s" | tee -a $R/device.txt
t=$(( $(left) - 5 )); [ $t -gt 60 ] && t=60
[ $t -ge 25 ] && PYTHONPATH=$PYTHONPATH:/tmp/pp TORCHINDUCTOR_CACHE_DIR=/tmp/ind-new timeout $t python3 -m pytest -q -p no:cacheprovider \
  tests/train/test_train_kernels.py tests/train/test_train_graphs.py -k "batch_major or replay_the_eager" 2>&1 | filt | tail -15 > $R/test-gpu.log
tail -3 $R/test-gpu.log; echo "tests done at $SECONDS s" | tee -a $R/device.txt
echo "all done at $SECONDS s" | tee -a $R/device.txt
pack
