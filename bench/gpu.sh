#!/usr/bin/env bash
# The train stage's GPU measurements: `bash bench/gpu.sh STAGE`, one stage a device call (each under 10 minutes).
# Each stage is the list of commands below; `run NAME COMMAND` keeps the command and its output in $OUT/NAME.log
# (default OUT: bench/results/gpu) and goes on after a failure; ONLY="NAME ..." runs only those names.
# Afterwards, here: `python3 bench/records.py $OUT --append` adds the runs to bench/results/gpu/records.json
# (a record a run: model, GPUs, rates, MFU, loss, machine, command), and a dated report in bench/results/ quotes
# what a doc cites.
#
# data      (here) real-text prefixes into .gpu/ from bench/corpora.py's cache: ~19 MB of prose and ~5.5 MB of
#           code as two pretrain prefixes blended 0.75/0.25, split 98/2/0; 6.5 MB of ShareGPT chats as qwen2p5 SFT
#           prefixes at seq 4096, packed and unpacked; 48 long
#           conversations packed into rows of 32768 (chat_long).
# pretrain  Qwen2.5-0.5B, 220 steps of 8 × 4096 tokens on the blend, validation at 110 and 220.
# sft       packed vs unpacked SFT, 40 steps.
# parallel  (2 GPUs) TP=1, TP=2 (± sequence parallel), PP=2, DP=2, Qwen3-0.6B TP=1/2: 50 steps from one seed.
# speed     today's settings (megatron's cross-entropy, nothing compiled, micro batch 1) against the fast ones.
# graphs    --cuda-graphs on against off (and tests/train/test_train_graphs.py); graphs-loss: 200 steps' losses;
#           fp8-graphs: 3B, FP8 tensorwise against bf16, graphed and eager, ROUNDS=N rounds (needs TE, see te).
# te        Transformer Engine's attention against PyTorch's, FP8 recipes against bf16 (needs TE:
#           ../shared/tools/device-te.sh); CHECKS=0 skips the GPU tests.
# scale     (2 GPUs) distributed optimizer, checkpoint resharding DP=2 → 1 → 2 and its --save-hf, recompute, 7B at
#           TP=2, over two pipeline stages and at DP=2, 3B, float32 weights (-f32w), context parallelism.
# moe       (1-2 GPUs) Qwen3-30B-A3B's shape with fewer layers: EP=2 against EP=1, grouped against sequential experts.
# cores     no GPU: the data side at 1, 2, 4 ... all cores' workers (bench/cores.py ARGS; bench/README.md: set-up).
set -euo pipefail
cd "$(dirname "$0")/.."
stage=${1:?stage: data, pretrain, sft, parallel, speed, graphs, graphs-loss, fp8-graphs, te, scale, moe or cores}
OUT=${OUT:-bench/results/gpu}
mkdir -p "$OUT"
# A bare GPU machine gets the project installed in place (no network there: no build isolation, no dependencies).
[ "$stage" = data ] || python3 -c "import qwen_data_train" 2>/dev/null \
  || python3 -m pip install -q --no-build-isolation --no-deps -e .
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore

run() {  # run NAME COMMAND...: the command and its output (Python's and torch's warnings left out) in $OUT/NAME.log
  local name=$1 started=$SECONDS; shift
  [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $name "* ]] || return 0
  echo "\$ $*" | tee "$OUT/$name.log"
  { "$@" 2>&1; echo "exit status $? after $((SECONDS - started)) s"; } \
    | grep -v -E "Warning|warnings\.warn|\]:\[W" | tee -a "$OUT/$name.log" || true
}

device() {  # the GPUs and the software a stage ran on
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, megatron.core as m; print('torch', torch.__version__, 'megatron-core', m.__version__)"
}

PT=.gpu/pretrain_blend.txt
SFT=.gpu/sft_packed.json
# What most runs share: the 0.5B shape, seq 4096, global batch 8; FAST: the defaults on CUDA, micro batch 4.
B="--seq-length 4096 --global-batch-size 8 --num-workers 2"
FAST="--cross-entropy fused --compile layers --micro-batch-size 4"

case $stage in
data)
  src=${QWEN_DATA_BENCH_CACHE:-$HOME/.cache/qwen-data-bench}
  python3 bench/corpora.py >/dev/null
  mkdir -p .gpu && tmp=$(mktemp -d)
  python3 - "$src" "$tmp" <<'EOF'
import json, re, sys
src, tmp = sys.argv[1:]
code_lines = re.compile(r"^(#include|#define|def |class |import |from \S+ import |struct |static )", re.M)
budget = {"web": 19e6, "code": 5.5e6}
files = {k: open(f"{tmp}/{k}.jsonl", "w") for k in budget}
for line in open(f"{src}/text.jsonl"):
    kind = "code" if len(code_lines.findall(json.loads(line)["text"])) >= 3 else "web"
    if budget[kind] > 0:
        files[kind].write(line)
        budget[kind] -= len(line.encode())
with open(f"{tmp}/chats.jsonl", "w") as out:
    size = 0
    for line in open(f"{src}/chats.jsonl"):
        if size > 6.5e6:
            break
        out.write(line)
        size += len(line.encode())
# Long chats for context parallelism: consecutive chats joined into one conversation of ~90k characters
# (~20-30k tokens), 48 of them.
with open(f"{tmp}/long_chats.jsonl", "w") as out:
    messages, size, made = [], 0, 0
    for line in open(f"{src}/chats.jsonl"):
        turns = [m for m in json.loads(line)["messages"] if m["role"] != "system"]
        messages, size = messages + turns, size + sum(len(m["content"]) for m in turns)
        if size > 90_000:
            out.write(json.dumps({"messages": messages}) + "\n")
            messages, size, made = [], 0, made + 1
            if made == 48:
                break
EOF
  qwen-data pretrain "$tmp/web.jsonl" -o .gpu/web --quiet
  qwen-data pretrain "$tmp/code.jsonl" -o .gpu/code --quiet
  qwen-data sft "$tmp/chats.jsonl" --template qwen2p5 -o .gpu/chat_packed --seq-length 4096 --pack --quiet
  qwen-data sft "$tmp/chats.jsonl" --template qwen2p5 -o .gpu/chat_unpacked --seq-length 4096 --quiet
  qwen-data sft "$tmp/long_chats.jsonl" --template qwen2p5 -o .gpu/chat_long --seq-length 32768 --pack --quiet
  rm -rf "$tmp" .gpu/*.rejects.jsonl
  qwen-data blend .gpu/web=0.75 .gpu/code=0.25 --split 98,2,0 -o .gpu/pretrain_blend
  qwen-data blend .gpu/chat_packed -o .gpu/sft_packed.json
  qwen-data blend .gpu/chat_unpacked -o .gpu/sft_unpacked.json
  du -sh .gpu ;;
pretrain)
  device | tee "$OUT/device.txt"
  run pretrain python3 -m train --data $PT --model qwen2.5-0.5b $B --micro-batch-size 1 --train-iters 220 --warmup-iters 20 --lr 6e-4 --min-lr 6e-5 --eval-interval 110 --eval-iters 4 --log-interval 10 --profile --log-json $OUT/pretrain.jsonl ;;
sft)
  S="--model qwen2.5-0.5b $B --micro-batch-size 1 --train-iters 40 --warmup-iters 5 --lr 1e-4 --min-lr 1e-5 --log-interval 10 --profile"
  run sft_packed python3 -m train --data .gpu/sft_packed.json $S --log-json $OUT/sft_packed.jsonl
  run sft_unpacked python3 -m train --data .gpu/sft_unpacked.json $S --log-json $OUT/sft_unpacked.jsonl ;;
parallel)
  # the fast settings; PP at micro batch 2, so that a step holds 4 micro-batches to pipeline
  P="-m train --data $PT --model qwen2.5-0.5b $B --train-iters 50 --log-interval 1 --warmup-iters 5 --micro-batch-size 4 --profile"
  run tp1 torchrun --nproc-per-node 1 $P --log-json $OUT/tp1.jsonl
  run tp2 torchrun --nproc-per-node 2 $P --tp 2 --log-json $OUT/tp2.jsonl
  run tp2_sp torchrun --nproc-per-node 2 $P --tp 2 --sequence-parallel --log-json $OUT/tp2_sp.jsonl
  run pp2 torchrun --nproc-per-node 2 $P --micro-batch-size 2 --pp 2 --log-json $OUT/pp2.jsonl
  run pp2_mb1 torchrun --nproc-per-node 2 $P --micro-batch-size 1 --pp 2 --log-json $OUT/pp2_mb1.jsonl
  run dp2 torchrun --nproc-per-node 2 $P --log-json $OUT/dp2.jsonl
  run q3_tp1 torchrun --nproc-per-node 1 $P --model qwen3-0.6b --log-json $OUT/q3_tp1.jsonl
  run q3_tp2 torchrun --nproc-per-node 2 $P --model qwen3-0.6b --tp 2 --log-json $OUT/q3_tp2.jsonl
  python3 bench/records.py --table --against $OUT/tp1.jsonl $OUT/{tp1,tp2,tp2_sp,pp2,pp2_mb1,dp2}.jsonl | tee $OUT/parallel.md
  python3 bench/records.py --table --against $OUT/q3_tp1.jsonl $OUT/q3_tp{1,2}.jsonl | tee -a $OUT/parallel.md ;;
speed)
  device | tee "$OUT/device.txt"
  S="timeout 300 python3 -m train --model qwen2.5-0.5b $B --warmup-iters 10 --lr 3e-4 --log-interval 10 --profile"
  TODAY="--cross-entropy megatron --compile none --micro-batch-size 1"
  # 100 steps where the loss at 100 is compared, else 20 (rates over iterations 11 on)
  run speed-0.5b-today $S --train-iters 100 --data $PT $TODAY --log-json $OUT/speed-0.5b-today.jsonl
  run speed-0.5b-fast $S --train-iters 100 --data $PT $FAST --log-json $OUT/speed-0.5b-fast.jsonl
  run speed-sft-today $S --train-iters 20 --data $SFT $TODAY --log-json $OUT/speed-sft-today.jsonl
  run speed-sft-fast $S --train-iters 40 --data $SFT $FAST --log-json $OUT/speed-sft-fast.jsonl
  run speed-1.5b-fast $S --train-iters 20 --data $PT --model qwen2.5-1.5b $FAST --log-json $OUT/speed-1.5b-fast.jsonl
  run speed-qwen3-0.6b-fast $S --train-iters 20 --data $PT --model qwen3-0.6b $FAST --log-json $OUT/speed-qwen3-0.6b-fast.jsonl
  python3 bench/records.py --table $OUT/speed-*.jsonl | tee $OUT/speed.md ;;
graphs)
  device | tee "$OUT/device.txt"
  run graphs_test python3 -m pytest -q -p no:cacheprovider tests/train/test_train_graphs.py
  G="timeout 300 python3 -m train --model qwen2.5-0.5b $B --warmup-iters 10 --lr 3e-4 --log-interval 10"
  for g in off on; do
    run graphs-pt-mb4-$g $G --micro-batch-size 4 --train-iters 40 --data $PT --cuda-graphs $g --log-json $OUT/graphs-pt-mb4-$g.jsonl
    run graphs-sft-mb4-$g $G --micro-batch-size 4 --train-iters 40 --data $SFT --cuda-graphs $g --log-json $OUT/graphs-sft-mb4-$g.jsonl
    run graphs-pt-mb1-$g $G --micro-batch-size 1 --train-iters 30 --data $PT --cuda-graphs $g --log-json $OUT/graphs-pt-mb1-$g.jsonl
  done ;;
fp8-graphs)  # one run at a time, the variants interleaved round by round
  G="timeout 300 python3 -m train --model qwen2.5-3b $B --micro-batch-size 2 --warmup-iters 5 --lr 3e-4 --log-interval 4 --train-iters 16 --data $PT --profile"
  for r in $(seq "${ROUNDS:-3}"); do
    run fp8-graphs-3b-mb2-bf16-eager-r$r $G --cuda-graphs off --log-json $OUT/fp8-graphs-3b-mb2-bf16-eager-r$r.jsonl
    run fp8-graphs-3b-mb2-tensorwise-graphed-r$r $G --fp8 tensorwise --cuda-graphs on --log-json $OUT/fp8-graphs-3b-mb2-tensorwise-graphed-r$r.jsonl
    run fp8-graphs-3b-mb2-bf16-graphed-r$r $G --cuda-graphs on --log-json $OUT/fp8-graphs-3b-mb2-bf16-graphed-r$r.jsonl
    run fp8-graphs-3b-mb2-tensorwise-eager-r$r $G --fp8 tensorwise --cuda-graphs off --log-json $OUT/fp8-graphs-3b-mb2-tensorwise-eager-r$r.jsonl
  done
  python3 bench/records.py --table $OUT/fp8-graphs-*.jsonl | tee $OUT/fp8-graphs.md ;;
graphs-loss)  # three runs at once: their losses, not their rates
  L="timeout 420 python3 -m train --model qwen2.5-0.5b --seq-length 4096 --micro-batch-size 2 --global-batch-size 4 --num-workers 2 --train-iters 200 --warmup-iters 20 --lr 3e-4 --log-interval 10"
  for kind in pt sft; do
    data=$PT; [ $kind = sft ] && data=$SFT
    run loss-$kind-eager-0 $L --data $data --seed 0 --cuda-graphs off --log-json $OUT/loss-$kind-eager-0.jsonl &
    run loss-$kind-eager-1 $L --data $data --seed 1 --cuda-graphs off --log-json $OUT/loss-$kind-eager-1.jsonl &
    run loss-$kind-graphed-0 $L --data $data --seed 0 --cuda-graphs on --log-json $OUT/loss-$kind-graphed-0.jsonl &
    wait
  done ;;
te)
  { device; python3 -c "import importlib.metadata as m; print('transformer-engine', m.version('transformer_engine'))" \
    || echo "transformer-engine not installed"; } \
    | tee "$OUT/te_device.txt"
  if [ "${CHECKS:-1}" = 1 ]; then
    run te_tests python3 -m pytest -q -p no:cacheprovider tests/train/test_train_compile.py tests/train/test_train_metrics.py
  fi
  T="timeout 400 python3 -m train --model qwen2.5-0.5b $B --warmup-iters 10 --lr 3e-4 --log-interval 10 --profile"
  export TORCH_LOGS=recompiles  # no compiled layer should recompile after step 1: the log counts them
  run te-pretrain-sdpa $T --train-iters 40 --data $PT $FAST --attention sdpa --log-json $OUT/te-pretrain-sdpa.jsonl
  run te-pretrain-te $T --train-iters 40 --data $PT $FAST --attention te --log-json $OUT/te-pretrain-te.jsonl
  run te-sft-sdpa $T --train-iters 40 --data $SFT $FAST --attention sdpa --log-json $OUT/te-sft-sdpa.jsonl
  run te-sft-te $T --train-iters 40 --data $SFT $FAST --attention te --log-json $OUT/te-sft-te.jsonl
  # FP8 against bf16, 20 steps, each the default path otherwise. 7B: 8 of its 28 layers (all of them do not fit one
  # 80 GB GPU with float32 master weights and AdamW). 3B at micro batch 2 (FP8: 81 GiB, an H200's), with selective
  # recompute (68 GiB), and with 18 of its 36 layers at micro batch 4 (what a GPU holds once data parallelism
  # shares the optimizer's state).
  F="$T --train-iters 20 --data $PT"
  for fp8 in bf16 tensorwise; do
    R=(); [ $fp8 = bf16 ] || R=(--fp8 $fp8)
    run te-fp8-0.5b-$fp8 $F --micro-batch-size 4 "${R[@]}" --log-json $OUT/te-fp8-0.5b-$fp8.jsonl
    run te-fp8-1.5b-$fp8 $F --model qwen2.5-1.5b --micro-batch-size 4 "${R[@]}" --log-json $OUT/te-fp8-1.5b-$fp8.jsonl
    run te-fp8-3b-mb2-$fp8 $F --model qwen2.5-3b --micro-batch-size 2 "${R[@]}" --log-json $OUT/te-fp8-3b-mb2-$fp8.jsonl
    run te-fp8-3b18l-mb4-$fp8 $F --model qwen2.5-3b --num-layers 18 --micro-batch-size 4 --global-batch-size 16 "${R[@]}" --log-json $OUT/te-fp8-3b18l-mb4-$fp8.jsonl
    run te-fp8-7b8l-$fp8 $F --model qwen2.5-7b --num-layers 8 --micro-batch-size 1 "${R[@]}" --log-json $OUT/te-fp8-7b8l-$fp8.jsonl
  done
  for fp8 in bf16 tensorwise delayed blockwise; do
    R=(); [ $fp8 = bf16 ] || R=(--fp8 $fp8)
    run te-fp8-3b-$fp8 $F --model qwen2.5-3b --micro-batch-size 1 "${R[@]}" --log-json $OUT/te-fp8-3b-$fp8.jsonl
  done
  for fp8 in bf16 tensorwise delayed; do
    R=(); [ $fp8 = bf16 ] || R=(--fp8 $fp8)
    run te-fp8-3b-mb2sel-$fp8 $F --model qwen2.5-3b --micro-batch-size 2 --recompute selective "${R[@]}" --log-json $OUT/te-fp8-3b-mb2sel-$fp8.jsonl
  done
  run te-fp8-3b-mb2sel-swiglu-tensorwise $F --model qwen2.5-3b --micro-batch-size 2 --recompute selective --compile swiglu --fp8 tensorwise --log-json $OUT/te-fp8-3b-mb2sel-swiglu-tensorwise.jsonl
  # The loss after 200 steps at 1.5B (seeds 2 and 3 besides the default: the spread FP8 is judged in), and of FP8
  # at 0.5B with its layers compiled against only the SwiGLU.
  L="$T --train-iters 200 --data $PT --micro-batch-size 4"
  run te-loss-1.5b-bf16 $L --model qwen2.5-1.5b --log-json $OUT/te-loss-1.5b-bf16.jsonl
  run te-loss-1.5b-tensorwise $L --model qwen2.5-1.5b --fp8 tensorwise --log-json $OUT/te-loss-1.5b-tensorwise.jsonl
  run te-loss-1.5b-s2-bf16 $L --model qwen2.5-1.5b --seed 2 --log-json $OUT/te-loss-1.5b-s2-bf16.jsonl
  run te-loss-1.5b-s2-tensorwise $L --model qwen2.5-1.5b --fp8 tensorwise --seed 2 --log-json $OUT/te-loss-1.5b-s2-tensorwise.jsonl
  run te-loss-1.5b-s3-bf16 $L --model qwen2.5-1.5b --seed 3 --log-json $OUT/te-loss-1.5b-s3-bf16.jsonl
  run te-fp8-0.5b-200-layers $L --fp8 tensorwise --compile layers --log-json $OUT/te-fp8-0.5b-200-layers.jsonl
  run te-fp8-0.5b-200-swiglu $L --fp8 tensorwise --compile swiglu --log-json $OUT/te-fp8-0.5b-200-swiglu.jsonl
  python3 bench/records.py --table $OUT/te-*.jsonl | tee $OUT/te.md ;;
scale)
  device | tee "$OUT/scale_device.txt"
  # Random init, seq 4096; -f32w: float32 weights (--no-bf16-weights) against the default's bf16 weights split
  # from their masters. 7b-pp2*: two pipeline stages, global batch 32 so that 32 micro-batches fill the pipeline
  # (-gb128: 128, a bubble of 1/129; -15-13: the last stage, which runs the output layer too, with 13 layers).
  S="timeout 500 torchrun --nproc-per-node 2 -m train --data $PT $B --warmup-iters 5 --lr 3e-4 --log-interval 5 --profile"
  S1="timeout 500 torchrun --nproc-per-node 1 -m train --data $PT $B --warmup-iters 5 --lr 3e-4 --log-interval 5 --profile"
  M="--model qwen2.5-0.5b --micro-batch-size 4"
  run scale-sp-swiglu $S --train-iters 10 $M --tp 2 --sequence-parallel --compile swiglu --log-interval 1 --log-json $OUT/scale-sp-swiglu.jsonl
  run scale-sp-layers $S --train-iters 10 $M --tp 2 --sequence-parallel --compile layers --log-interval 1 --log-json $OUT/scale-sp-layers.jsonl
  run scale-dp2-plain $S --train-iters 50 $M --log-interval 1 --log-json $OUT/scale-dp2-plain.jsonl
  run scale-dp2-plain-f32w $S --train-iters 50 $M --log-interval 1 --no-bf16-weights --log-json $OUT/scale-dp2-plain-f32w.jsonl
  run scale-dp2-distopt $S --train-iters 50 $M --log-interval 1 --distributed-optimizer --log-json $OUT/scale-dp2-distopt.jsonl
  run scale-dp2-distopt-sync $S --train-iters 30 $M --distributed-optimizer --no-overlap-grad-reduce --no-overlap-param-gather --log-json $OUT/scale-dp2-distopt-sync.jsonl
  # a distributed-optimizer run saved at DP=2, resumed at DP=1 and again at DP=2, against ckpt-ref uninterrupted
  C="--train-iters 8 --model qwen2.5-0.5b --micro-batch-size 1 --compile swiglu --log-interval 1 --distributed-optimizer --lr 1e-4"
  rm -rf /tmp/scale-ckpt /tmp/scale-hf /tmp/scale-hf-converted
  run scale-ckpt-ref $S $C --log-json $OUT/scale-ckpt-ref.jsonl
  run scale-ckpt-a $S $C --exit-after 3 --save /tmp/scale-ckpt --log-json $OUT/scale-ckpt-a.jsonl
  run scale-ckpt-b $S1 $C --exit-after 6 --load /tmp/scale-ckpt --save /tmp/scale-ckpt --log-json $OUT/scale-ckpt-b.jsonl
  run scale-ckpt-c $S $C --load /tmp/scale-ckpt --save /tmp/scale-ckpt --save-hf /tmp/scale-hf --log-json $OUT/scale-ckpt-c.jsonl
  run scale-hf-exact python3 -m train.convert mcore-to-hf /tmp/scale-ckpt /tmp/scale-hf-converted
  for r in none selective full; do
    run scale-recompute-$r $S1 --train-iters 20 --model qwen2.5-1.5b --micro-batch-size 2 --recompute $r --log-json $OUT/scale-recompute-$r.jsonl
    run scale-7b-$r $S --train-iters 20 --model qwen2.5-7b --micro-batch-size 1 --tp 2 --sequence-parallel --recompute $r --log-json $OUT/scale-7b-$r.jsonl
  done
  run scale-7b-none-f32w $S --train-iters 20 --model qwen2.5-7b --micro-batch-size 1 --tp 2 --sequence-parallel --no-bf16-weights --log-json $OUT/scale-7b-none-f32w.jsonl
  P7="--model qwen2.5-7b --micro-batch-size 1 --pp 2 --log-interval 1"
  run scale-7b-pp2 $S --train-iters 10 $P7 --global-batch-size 32 --log-json $OUT/scale-7b-pp2.jsonl
  run scale-7b-pp2-15-13 $S --train-iters 10 $P7 --global-batch-size 32 --decoder-last-pipeline-num-layers 13 --log-json $OUT/scale-7b-pp2-15-13.jsonl
  run scale-7b-pp2-f32w $S --train-iters 10 $P7 --global-batch-size 32 --no-bf16-weights --log-json $OUT/scale-7b-pp2-f32w.jsonl
  run scale-7b-pp2-gb128 $S --train-iters 8 $P7 --global-batch-size 128 --log-json $OUT/scale-7b-pp2-gb128.jsonl
  run scale-7b-pp2-gb128-f32w $S --train-iters 8 $P7 --global-batch-size 128 --no-bf16-weights --log-json $OUT/scale-7b-pp2-gb128-f32w.jsonl
  run scale-7b-pp2-sft-gb128 $S --train-iters 8 $P7 --global-batch-size 128 --data $SFT --log-json $OUT/scale-7b-pp2-sft-gb128.jsonl
  run scale-7b-pp2-15-13-gb128 $S --train-iters 8 $P7 --global-batch-size 128 --decoder-last-pipeline-num-layers 13 --log-json $OUT/scale-7b-pp2-15-13-gb128.jsonl
  # data-parallel 7B with the distributed optimizer: 107 GiB a GPU, H200 only
  run scale-7b-dp2 $S --train-iters 10 --model qwen2.5-7b --micro-batch-size 1 --distributed-optimizer --global-batch-size 32 --log-interval 1 --log-json $OUT/scale-7b-dp2.jsonl
  run scale-3b-one $S1 --train-iters 20 --model qwen2.5-3b --micro-batch-size 1 --log-json $OUT/scale-3b-one.jsonl
  run scale-3b-one-f32w $S1 --train-iters 20 --model qwen2.5-3b --micro-batch-size 1 --no-bf16-weights --log-json $OUT/scale-3b-one-f32w.jsonl
  run scale-3b-dp2 $S --train-iters 20 --model qwen2.5-3b --micro-batch-size 1 --log-json $OUT/scale-3b-dp2.jsonl
  run scale-3b-dp2-f32w $S --train-iters 20 --model qwen2.5-3b --micro-batch-size 1 --no-bf16-weights --log-json $OUT/scale-3b-dp2-f32w.jsonl
  # context parallelism: the same rows of 16384 tokens on one GPU and over two; packed SFT rows of 32768 over two
  run scale-cp1 $S1 --train-iters 20 --model qwen2.5-0.5b --micro-batch-size 1 --seq-length 16384 --log-json $OUT/scale-cp1.jsonl
  run scale-cp2 $S --train-iters 20 --model qwen2.5-0.5b --micro-batch-size 1 --seq-length 16384 --cp 2 --log-json $OUT/scale-cp2.jsonl
  run scale-cp-long $S --train-iters 20 --model qwen2.5-0.5b --micro-batch-size 1 --seq-length 32768 --cp 2 --data .gpu/chat_long --global-batch-size 2 --eval-interval 0 --log-json $OUT/scale-cp-long.jsonl
  python3 bench/records.py --table $OUT/scale-*.jsonl | tee $OUT/scale.md
  python3 bench/records.py --table --against $OUT/scale-dp2-plain.jsonl $OUT/scale-dp2-distopt.jsonl | tee -a $OUT/scale.md
  python3 bench/records.py --table --against $OUT/scale-ckpt-ref.jsonl $OUT/scale-ckpt-{b,c}.jsonl | tee -a $OUT/scale.md
  python3 bench/records.py --table --against $OUT/scale-cp1.jsonl $OUT/scale-cp2.jsonl | tee -a $OUT/scale.md ;;
moe)
  device | tee "$OUT/moe_device.txt"
  # Random init: the 48 layers need ~490 GB of float32 weights, gradients and AdamW. ep1/ep2: 2 layers on two GPUs,
  # experts on both against split over them, 50 steps, same seed and data; one/two-ep2: 4 layers on one GPU and on
  # two; two-ep2-mb8: the 30% goal's run (51 GiB a GPU on H200s); eight-ep2-mb2: 8 layers at micro batch 2 (71 GiB a GPU:
  # the most an 80 GB H100 holds).
  E="-m train --data $PT $B --warmup-iters 5 --lr 3e-4 --log-interval 5 --profile --model qwen3-30b-a3b --micro-batch-size 1 --attention sdpa"
  run moe-ep1 timeout 500 torchrun --nproc-per-node 2 $E --train-iters 50 --num-layers 2 --log-interval 1 --log-json $OUT/moe-ep1.jsonl
  run moe-ep2 timeout 500 torchrun --nproc-per-node 2 $E --train-iters 50 --num-layers 2 --ep 2 --log-interval 1 --log-json $OUT/moe-ep2.jsonl
  run moe-one timeout 500 torchrun --nproc-per-node 1 $E --train-iters 20 --num-layers 4 --log-json $OUT/moe-one.jsonl
  run moe-one-mb4 timeout 500 torchrun --nproc-per-node 1 $E --train-iters 20 --num-layers 4 --micro-batch-size 4 --log-json $OUT/moe-one-mb4.jsonl
  run moe-one-mb4-swiglu timeout 500 torchrun --nproc-per-node 1 $E --train-iters 20 --num-layers 4 --micro-batch-size 4 --compile swiglu --log-json $OUT/moe-one-mb4-swiglu.jsonl
  run moe-one-sequential timeout 500 torchrun --nproc-per-node 1 $E --train-iters 20 --num-layers 4 --no-moe-grouped-gemm --log-json $OUT/moe-one-sequential.jsonl
  run moe-two-ep2 timeout 500 torchrun --nproc-per-node 2 $E --train-iters 20 --num-layers 4 --ep 2 --log-json $OUT/moe-two-ep2.jsonl
  run moe-two-ep2-mb4 timeout 500 torchrun --nproc-per-node 2 $E --train-iters 20 --num-layers 4 --ep 2 --micro-batch-size 4 --log-json $OUT/moe-two-ep2-mb4.jsonl
  run moe-two-ep2-mb8 timeout 500 torchrun --nproc-per-node 2 $E --train-iters 20 --num-layers 4 --ep 2 --micro-batch-size 8 --global-batch-size 16 --log-json $OUT/moe-two-ep2-mb8.jsonl
  run moe-eight-ep2-mb2 timeout 500 torchrun --nproc-per-node 2 $E --train-iters 20 --num-layers 8 --ep 2 --micro-batch-size 2 --log-json $OUT/moe-eight-ep2-mb2.jsonl
  run moe-sft-sdpa timeout 500 torchrun --nproc-per-node 1 $E --train-iters 20 --num-layers 4 --data $SFT --log-json $OUT/moe-sft-sdpa.jsonl
  run moe-sft-te timeout 500 torchrun --nproc-per-node 1 $E --train-iters 20 --num-layers 4 --data $SFT --attention te --log-json $OUT/moe-sft-te.jsonl
  run moe-pretrain-te timeout 500 torchrun --nproc-per-node 1 $E --train-iters 20 --num-layers 4 --attention te --log-json $OUT/moe-pretrain-te.jsonl
  python3 bench/records.py --table $OUT/moe-*.jsonl | tee $OUT/moe.md
  python3 bench/records.py --table --against $OUT/moe-ep1.jsonl $OUT/moe-ep2.jsonl | tee -a $OUT/moe.md ;;
cores)  # the data side's own dependencies and corpora, carried in (bench/README.md)
  shift
  python3 -c "import gigatoken" 2>/dev/null || python3 -m pip install -q --no-index --no-deps .whl/*.whl
  export QWEN_DATA_BENCH_CACHE=${QWEN_DATA_BENCH_CACHE:-/tmp/qwen-data-bench}
  mkdir -p "$QWEN_DATA_BENCH_CACHE" && tar -C "$QWEN_DATA_BENCH_CACHE" -xzf .gpu/cores/cache.tar.gz
  { grep -m1 "model name" /proc/cpuinfo; nproc; free -g | head -2; } | tee "$OUT/cores-host.txt"
  python3 bench/cores.py --out "$OUT/cores.json" "$@" 2>&1 | tee "$OUT/cores.log" ;;
*)
  echo "unknown stage $stage" >&2; exit 2 ;;
esac
