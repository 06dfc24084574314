#!/usr/bin/env bash
# The train stage's GPU measurements, one stage per device call (each well under 10 minutes).
#
#   bench/gpu.sh data                 # here: real-text prefixes into .gpu/ (needs bench/corpora.py's cache)
#   bench/gpu.sh pretrain|sft|parallel|speed|te|scale|moe  # there: the runs, logs under $OUT (default bench/results/gpu)
#   bench/gpu.sh cores [ARGS]         # there: the data side on the host's CPUs (bench/cores.py ARGS), $OUT/cores.json
#
# Data (`data`): ~19 MB of the multilingual prose and ~5.5 MB of the code of bench/corpora.py's
# text corpus as two pretrain prefixes blended 0.75/0.25 with a 98/2/0 split; the first 6.5 MB of
# its ShareGPT chats as qwen2p5 SFT prefixes at seq 4096, packed and unpacked (same samples); 48 long
# conversations (consecutive chats joined) packed into rows of 32768 tokens (chat_long).
#
# pretrain  (a) qwen2.5-0.5b, 220 steps of 8 × 4096 tokens on the pretrain blend, validation at
#           110 and 220; (c) its tokens/s and MFU against the 37.1k tokens/s SDPA figure;
#           (d) its data-loading share of step time.
# sft       (b) per-token losses of packed rows against their samples alone (bench/train_gpu.py);
#           (c) the same SFT samples packed vs unpacked (one padded sample a row), 40 steps each.
# parallel  (e) TP=1, TP=2 (with and without sequence parallelism), PP=2 and DP=2 from the same seed
#           on two GPUs, 50 steps, and Qwen3-0.6B at TP=1 and 2: losses against TP=1's and tokens/s
#           ($OUT/parallel.md).
# speed     today's settings (megatron-core's output layer and loss, nothing compiled, micro batch 1)
#           against the fast ones, seq 4096, global batch 8: Qwen2.5-0.5B pretraining and packed
#           SFT, Qwen2.5-1.5B and Qwen3-0.6B pretraining; logs as $OUT/speed-*.jsonl, then the
#           table of bench/gpu_table.py. SPEED="name:steps:args;..." replaces the list (probes).
# te        Transformer Engine against PyTorch's attention (needs TE: ../shared/tools/device-te.sh), 0.5B at
#           seq 4096, micro batch 4, global batch 8, layers compiled: pretraining and packed SFT under
#           each, dynamo's recompiles counted (TORCH_LOGS=recompiles); packed rows through TE's THD
#           against their samples alone; the GPU tests of tests/train/test_train_compile.py and
#           test_train_metrics.py; one attention layer's kernels timed (bench/train_gpu.py attention); FP8 recipes against bf16 at the 0.5B,
#           1.5B, 3B and 7B shapes (7B: 8 of its layers), and the loss after 200 steps at 1.5B; then
#           $OUT/te.json (bench/te_report.py). TE_ONLY="name ..." runs only those (a call may hold only
#           some: te.json takes every te-*.jsonl under $OUT); TE_CHECKS=0 skips the checks; TE_ROUNDS=2 runs
#           them twice over, interleaved; TE_PROFILE=1 profiles the FP8 runs and their bf16 ones besides.
# scale     two GPUs: sequence parallelism with compiled layers, the distributed optimizer against plain DP
#           (losses over 50 steps, speed with and without overlap, a checkpoint resharded DP=2 → 1 → 2 and
#           its --save-hf export), recompute none/selective/full, the Qwen2.5-7B shape at TP=2, Qwen2.5-3B on
#           one GPU; then $OUT/scale.json (bench/scale_report.py). SCALE_ONLY="name ..." runs only those.
# graphs    --cuda-graphs on against off: tests/train/test_train_graphs.py (capture and replay = eager steps),
#           then Qwen2.5-0.5B pretraining and packed SFT at micro batch 4, and pretraining at micro batch 1,
#           40 steps each (30 at micro batch 1); add them with bench/records.py.
# graphs-loss  200 steps of 0.5B pretraining and packed SFT (micro batch 2, global batch 4): eager under seeds 0
#           and 1, graphed under seed 0, three runs at once (their losses, not their rates).
# cores     no GPU: pretrain and SFT at 1, 2, 4 ... all cores' workers (bench/cores.py). Needs, carried:
#           .whl (bash ../shared/tools/device-wheels.sh data) and .gpu/cores/cache.tar.gz (bench/corpora.py's
#           text.jsonl and chats.jsonl with their .json, as `tar -C ~/.cache/qwen-data-bench -czf ...`).
# moe       two GPUs: the Qwen3-30B-A3B shape with fewer layers, EP=2 against EP=1 (losses over 50 steps) and
#           tokens/s on one GPU and on two with EP=2; then $OUT/moe.json (bench/moe_report.py).
# After te, scale or moe, with $OUT's files in the checkout: `python3 bench/records.py $OUT --append` adds the
# stage's runs to bench/results/gpu/records.json (each run's model, GPUs, rates, MFU, loss and machine).
set -euo pipefail
cd "$(dirname "$0")/.."
stage=${1:?stage: data, pretrain, sft, parallel or speed}
OUT=${OUT:-bench/results/gpu}
mkdir -p "$OUT"
if [ "$stage" = cores ]; then  # the data side's own dependencies are not on a GPU machine
  python3 -c "import gigatoken" 2>/dev/null || python3 -m pip install -q --no-index --no-deps .whl/*.whl
  export QWEN_DATA_BENCH_CACHE=${QWEN_DATA_BENCH_CACHE:-/tmp/qwen-data-bench}
  mkdir -p "$QWEN_DATA_BENCH_CACHE" && tar -C "$QWEN_DATA_BENCH_CACHE" -xzf .gpu/cores/cache.tar.gz
fi
# The bench scripts import the train stage as installed (qwen_data_train): a bare GPU machine gets the
# project installed in place (no network there: no build isolation, no dependencies).
[ "$stage" = data ] || python3 -c "import qwen_data_train" 2>/dev/null \
  || python3 -m pip install -q --no-build-isolation --no-deps -e .
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
COMMON=(--model qwen2.5-0.5b --seq-length 4096 --micro-batch-size 1 --global-batch-size 8 --num-workers 2)

quiet() {  # Python's and torch's warnings left out (the trainer's own "warning: ..." lines kept)
  grep -v -E "Warning|warnings\.warn|\]:\[W"
}

run() {  # run NAME ARGS...: the command and its output, both kept; a failure does not stop the stage
  local name=$1 started=$SECONDS; shift
  echo "\$ $*" | tee "$OUT/$name.log"
  { "$@" 2>&1; echo "exit status $? after $((SECONDS - started)) s"; } | quiet | tee -a "$OUT/$name.log" || true
}

device() {  # device FILE: the GPUs, then the software the stage runs on
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$1"
  python3 -c "import torch, megatron.core as m; print('torch', torch.__version__, 'megatron-core', m.__version__)" \
    | tee -a "$1"
}

torchruns() {  # torchruns STAGE ONLY "NAME:PROCESSES:STEPS:ARGS;...": each run after $D (ONLY: names to run; empty: all)
  local stage=$1 only=$2 spec name nproc steps args runs
  IFS=';' read -ra runs <<< "$3"
  for spec in "${runs[@]}"; do
    IFS=':' read -r name nproc steps args <<< "$spec"
    [ -z "$only" ] || [[ " $only " == *" $name "* ]] || continue
    rm -f "$OUT/$stage-$name.jsonl"
    # shellcheck disable=SC2086  # args are words
    run "$stage-$name" timeout 500 torchrun --nproc-per-node "$nproc" -m train $D --train-iters "$steps" \
      --log-interval 5 $args --profile --log-json "$OUT/$stage-$name.jsonl"
  done
}

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
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/device.txt"
  python3 -c "import torch, megatron.core as m; print('torch', torch.__version__, 'megatron-core', m.__version__)" \
    | tee -a "$OUT/device.txt"
  run pretrain python3 -m train --data .gpu/pretrain_blend.txt "${COMMON[@]}" --train-iters 220 \
    --warmup-iters 20 --lr 6e-4 --min-lr 6e-5 --eval-interval 110 --eval-iters 4 --log-interval 10 \
    --profile --log-json "$OUT/pretrain.jsonl" ;;
sft)
  run packed_check python3 bench/train_gpu.py packed --data .gpu/sft_packed.json --model qwen2.5-0.5b --rows 4
  for kind in packed unpacked; do
    run "sft_$kind" python3 -m train --data ".gpu/sft_$kind.json" "${COMMON[@]}" --train-iters 40 \
      --warmup-iters 5 --lr 1e-4 --min-lr 1e-5 --log-interval 10 --profile --log-json "$OUT/sft_$kind.jsonl"
  done ;;
parallel)
  # The fast settings (micro batch 4; 2 with stages, so a step holds 4 micro-batches to pipeline).
  # PARALLEL="name:processes:args;..." picks runs; q3_* (Qwen3-0.6B: QK norms) compare with q3_tp1.
  P=(--data .gpu/pretrain_blend.txt "${COMMON[@]}" --train-iters 50 --log-interval 1 --warmup-iters 5)
  Q3="--model qwen3-0.6b --micro-batch-size 4"
  PARALLEL=${PARALLEL:-"tp1:1:--micro-batch-size 4;tp2:2:--micro-batch-size 4 --tp 2;\
tp2_sp:2:--micro-batch-size 4 --tp 2 --sequence-parallel;pp2:2:--micro-batch-size 2 --pp 2;\
pp2_mb1:2:--micro-batch-size 1 --pp 2;dp2:2:--micro-batch-size 4;q3_tp1:1:$Q3;q3_tp2:2:$Q3 --tp 2"}
  IFS=';' read -ra runs <<< "$PARALLEL"
  for spec in "${runs[@]}"; do
    IFS=':' read -r name nproc args <<< "$spec"
    rm -f "$OUT/$name.jsonl"
    # shellcheck disable=SC2086  # args are words
    run "$name" torchrun --nproc-per-node "$nproc" -m train "${P[@]}" $args --profile --log-json "$OUT/$name.jsonl"
  done
  logs() { for n in "$@"; do [ -f "$OUT/$n.jsonl" ] && echo "$OUT/$n.jsonl"; done; }
  # shellcheck disable=SC2046
  python3 bench/gpu_table.py --against "$OUT/tp1.jsonl" $(logs tp2 tp2_sp pp2 pp2_mb1 dp2) | tee "$OUT/parallel.md"
  # shellcheck disable=SC2046
  [ -f "$OUT/q3_tp1.jsonl" ] && python3 bench/gpu_table.py --against "$OUT/q3_tp1.jsonl" $(logs q3_tp2) \
    | tee -a "$OUT/parallel.md"
  echo "parallel stage: $SECONDS s" ;;
speed)
  device "$OUT/device.txt"
  TODAY="--cross-entropy megatron --compile none --micro-batch-size 1"
  FAST="--cross-entropy fused --compile layers --micro-batch-size 4"
  PT="--data .gpu/pretrain_blend.txt"
  SFT="--data .gpu/sft_packed.json"
  # Steps: 100 where the loss at 100 is compared, else 20 (rates are taken over iterations 11-20).
  SPEED=${SPEED:-"0.5b-today:100:$PT $TODAY;0.5b-fast:100:$PT $FAST;sft-today:20:$SFT $TODAY;\
sft-fast:40:$SFT $FAST;1.5b-fast:20:$PT --model qwen2.5-1.5b $FAST;qwen3-0.6b-fast:20:$PT --model qwen3-0.6b $FAST"}
  IFS=';' read -ra runs <<< "$SPEED"
  for spec in "${runs[@]}"; do
    IFS=':' read -r name steps args <<< "$spec"
    rm -f "$OUT/speed-$name.jsonl"
    # shellcheck disable=SC2086  # args are words
    run "speed-$name" timeout 300 python3 -m train --model qwen2.5-0.5b --seq-length 4096 --global-batch-size 8 \
      --num-workers 2 --train-iters "$steps" --warmup-iters 10 --lr 3e-4 --log-interval 10 $args \
      --profile --log-json "$OUT/speed-$name.jsonl"
  done
  python3 bench/gpu_table.py "$OUT"/speed-*.jsonl | tee "$OUT/speed.md"
  python3 bench/gpu_table.py --flash | tee "$OUT/flash.txt"
  echo "speed stage: $SECONDS s" ;;
graphs)
  device "$OUT/device.txt"
  run graphs_test python3 -m pytest -q -p no:cacheprovider tests/train/test_train_graphs.py
  for spec in pt:4:40 sft:4:40 pt:1:30; do
    IFS=: read -r kind mb steps <<< "$spec"
    data=.gpu/pretrain_blend.txt; [ "$kind" = sft ] && data=.gpu/sft_packed.json
    for g in off on; do
      name=graphs-$kind-mb$mb-$g
      run "$name" timeout 300 python3 -m train --model qwen2.5-0.5b --seq-length 4096 --global-batch-size 8 \
        --micro-batch-size "$mb" --num-workers 2 --train-iters "$steps" --warmup-iters 10 --lr 3e-4 --log-interval 10 \
        --data "$data" --cuda-graphs "$g" --log-json "$OUT/$name.jsonl"
    done
  done ;;
graphs-loss)
  for kind in pt sft; do
    data=.gpu/pretrain_blend.txt; [ "$kind" = sft ] && data=.gpu/sft_packed.json
    for spec in eager-0:off:0 eager-1:off:1 graphed-0:on:0; do
      IFS=: read -r name g seed <<< "$spec"
      run "loss-$kind-$name" timeout 420 python3 -m train --model qwen2.5-0.5b --seq-length 4096 --micro-batch-size 2 \
        --global-batch-size 4 --num-workers 2 --train-iters 200 --warmup-iters 20 --lr 3e-4 --log-interval 10 \
        --data "$data" --seed "$seed" --cuda-graphs "$g" --log-json "$OUT/loss-$kind-$name.jsonl" &
    done
    wait
  done ;;
te)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/te_device.txt"
  python3 -c "import importlib.metadata as md, qwen_data_train, torch, megatron.core as m; print('torch', torch.__version__, \
'megatron-core', m.__version__, 'cudnn', torch.backends.cudnn.version(), 'transformer-engine', \
md.version('transformer_engine') if __import__('importlib.util').util.find_spec('transformer_engine') else None)" \
    | tee -a "$OUT/te_device.txt"
  if [ "${TE_CHECKS:-1}" = 1 ]; then
    run te_packed_check python3 bench/train_gpu.py packed --data .gpu/sft_packed.json --model qwen2.5-0.5b \
      --rows 4 --attention te --json "$OUT/te_packed_parity.json"
    run te_tests python3 -m pytest -q -p no:cacheprovider tests/train/test_train_compile.py tests/train/test_train_metrics.py
    run te_attention python3 bench/train_gpu.py attention --model qwen2.5-0.5b --seq-length 4096 --micro-batch-size 4
  fi
  FAST="--cross-entropy fused --compile layers --micro-batch-size 4"
  PT="--data .gpu/pretrain_blend.txt $FAST"
  SFT="--data .gpu/sft_packed.json $FAST"
  # FP8 against bf16 (each the default path otherwise), 20 steps; Qwen2.5-7B with 8 of its 28 layers (all of
  # them do not fit one 80 GB GPU with float32 master weights and AdamW); 3B at micro batch 2 (FP8 81 GiB: an
  # H200's) and with selective recompute besides (68 GiB; tensorwise and delayed), and with 18 of its 36 layers
  # at micro batch 4 (what a GPU holds at 3B once data parallelism shares the optimizer's state); the loss after
  # 200 steps at 1.5B (seeds 2 and 3 besides the default: the spread of bf16 runs that the FP8 one is judged in),
  # and of FP8 at 0.5B with its layers compiled against only the SwiGLU.
  B="--data .gpu/pretrain_blend.txt --global-batch-size 8"
  FP8="fp8-0.5b-bf16:20:$B --micro-batch-size 4;fp8-0.5b-tensorwise:20:$B --micro-batch-size 4 --fp8 tensorwise;\
fp8-1.5b-bf16:20:$B --model qwen2.5-1.5b --micro-batch-size 4;\
fp8-1.5b-tensorwise:20:$B --model qwen2.5-1.5b --micro-batch-size 4 --fp8 tensorwise;\
fp8-3b-bf16:20:$B --model qwen2.5-3b --micro-batch-size 1;\
fp8-3b-tensorwise:20:$B --model qwen2.5-3b --micro-batch-size 1 --fp8 tensorwise;\
fp8-3b-delayed:20:$B --model qwen2.5-3b --micro-batch-size 1 --fp8 delayed;\
fp8-3b-blockwise:20:$B --model qwen2.5-3b --micro-batch-size 1 --fp8 blockwise;\
fp8-3b-mb2-bf16:20:$B --model qwen2.5-3b --micro-batch-size 2;\
fp8-3b-mb2-tensorwise:20:$B --model qwen2.5-3b --micro-batch-size 2 --fp8 tensorwise;\
fp8-3b-mb2sel-bf16:20:$B --model qwen2.5-3b --micro-batch-size 2 --recompute selective;\
fp8-3b-mb2sel-tensorwise:20:$B --model qwen2.5-3b --micro-batch-size 2 --recompute selective --fp8 tensorwise;\
fp8-3b-mb2sel-delayed:20:$B --model qwen2.5-3b --micro-batch-size 2 --recompute selective --fp8 delayed;\
fp8-3b-mb2sel-swiglu-tensorwise:20:$B --model qwen2.5-3b --micro-batch-size 2 --recompute selective --compile swiglu \
--fp8 tensorwise;\
fp8-3b18l-mb4-bf16:20:$B --model qwen2.5-3b --num-layers 18 --micro-batch-size 4 --global-batch-size 16;\
fp8-3b18l-mb4-tensorwise:20:$B --model qwen2.5-3b --num-layers 18 --micro-batch-size 4 --global-batch-size 16 --fp8 tensorwise;\
fp8-7b8l-bf16:20:$B --model qwen2.5-7b --num-layers 8 --micro-batch-size 1;\
fp8-7b8l-tensorwise:20:$B --model qwen2.5-7b --num-layers 8 --micro-batch-size 1 --fp8 tensorwise;\
loss-1.5b-bf16:200:$B --model qwen2.5-1.5b --micro-batch-size 4;\
loss-1.5b-tensorwise:200:$B --model qwen2.5-1.5b --micro-batch-size 4 --fp8 tensorwise;\
loss-1.5b-s2-bf16:200:$B --model qwen2.5-1.5b --micro-batch-size 4 --seed 2;\
loss-1.5b-s2-tensorwise:200:$B --model qwen2.5-1.5b --micro-batch-size 4 --fp8 tensorwise --seed 2;\
loss-1.5b-s3-bf16:200:$B --model qwen2.5-1.5b --micro-batch-size 4 --seed 3;\
fp8-0.5b-200-layers:200:$B --micro-batch-size 4 --fp8 tensorwise --compile layers;\
fp8-0.5b-200-swiglu:200:$B --micro-batch-size 4 --fp8 tensorwise --compile swiglu"
  TE_RUNS="pretrain-sdpa:40:$PT --attention sdpa;pretrain-te:40:$PT --attention te;\
sft-sdpa:40:$SFT --attention sdpa;sft-te:40:$SFT --attention te;$FP8"
  # TE_ROUNDS=N runs the list N times over (names end -r1, -r2, ...: a machine's drift shows between rounds, and
  # each FP8 run is set against the bf16 run of its round); TE_PROFILE=1 profiles each FP8 run and its bf16 one
  # of the first round (bench/train_gpu.py profile: GPU-bound or launch-bound) into te-NAME.profile.
  IFS=';' read -ra runs <<< "$TE_RUNS"
  rounds=${TE_ROUNDS:-1}
  for round in $(seq "$rounds"); do
    for spec in "${runs[@]}"; do
      IFS=':' read -r name steps args <<< "$spec"
      [ -z "${TE_ONLY:-}" ] || [[ " $TE_ONLY " == *" $name "* ]] || continue
      what=$name && [ "$rounds" = 1 ] || what=$name-r$round
      rm -f "$OUT/te-$what.jsonl"
      TRAIN=(--model qwen2.5-0.5b --seq-length 4096 --global-batch-size 8 --num-workers 2 --warmup-iters 10 --lr 3e-4)
      # shellcheck disable=SC2086  # args are words
      TORCH_LOGS=recompiles run "te-$what" timeout 400 python3 -m train "${TRAIN[@]}" --train-iters "$steps" \
        --log-interval 10 $args --profile --log-json "$OUT/te-$what.jsonl"
      if [ "${TE_PROFILE:-0}" = 1 ] && [ "$round" = 1 ] && [[ $name == fp8-* ]]; then
        # shellcheck disable=SC2086
        timeout 300 python3 bench/train_gpu.py profile --warm 4 --steps 2 -- "${TRAIN[@]}" --train-iters 10 $args \
          2>&1 | quiet > "$OUT/te-$what.profile" || true
      fi
    done
  done
  python3 bench/te_report.py "$OUT" | tee "$OUT/te.md"
  echo "te stage: $SECONDS s" ;;
scale)
  device "$OUT/scale_device.txt"
  # NAME:PROCESSES:STEPS:ARGS (SCALE_ONLY="name ..." runs only those). sp-*: sequence parallelism with and
  # without compiled layers (same losses); dp2-*: plain DP (torch DDP) against the distributed optimizer, with
  # and without overlap; ckpt-*: a distributed-optimizer run saved at DP=2, resumed at DP=1 and again at DP=2,
  # against ckpt-ref uninterrupted; recompute-*: none, selective, full at Qwen2.5-1.5B on one GPU; 7b-*: the
  # Qwen2.5-7B shape (random init), seq 4096, at TP=2 with sequence parallelism; 7b-pp2/7b-dp2: over two pipeline
  # stages (layers compiled; global batch 32, so 32 micro-batches fill the pipeline; 7b-pp2-15-13: the last stage,
  # which runs the output layer too, with 13 layers; -gb128: 128 micro-batches a step, a pipeline bubble of
  # 1/129 instead of 1/33; -sft: the bench chats' packed SFT rows), and data-parallel with the distributed optimizer
  # (107 GiB a GPU: H200 only); 3b-one: Qwen2.5-3B on one GPU, 3b-dp2 on two by torch's DDP; -f32w: float32 weights
  # (--no-bf16-weights) against the default's bf16 weights split from their masters, beside TP+SP, PP and DP;
  # cp1/cp2: the same rows of 16384 tokens on one GPU and split over two (--cp 2); cp-long: packed SFT rows of
  # 32768 tokens (the long chats) over two.
  D="--data .gpu/pretrain_blend.txt --seq-length 4096 --global-batch-size 8 --num-workers 2 --warmup-iters 5 --lr 3e-4"
  M="--model qwen2.5-0.5b --micro-batch-size 4"
  C="--model qwen2.5-0.5b --micro-batch-size 1 --compile swiglu --log-interval 1 --train-iters 8 --distributed-optimizer --lr 1e-4"
  K=/tmp/scale-ckpt
  SCALE="sp-swiglu:2:10:$M --tp 2 --sequence-parallel --compile swiglu --log-interval 1;\
sp-layers:2:10:$M --tp 2 --sequence-parallel --compile layers --log-interval 1;\
dp2-plain:2:50:$M --log-interval 1;dp2-plain-f32w:2:50:$M --log-interval 1 --no-bf16-weights;dp2-distopt:2:50:$M --log-interval 1 --distributed-optimizer;\
dp2-distopt-sync:2:30:$M --distributed-optimizer --no-overlap-grad-reduce --no-overlap-param-gather;\
ckpt-ref:2:8:$C;ckpt-a:2:8:$C --exit-after 3 --save $K;ckpt-b:1:8:$C --exit-after 6 --load $K --save $K;\
ckpt-c:2:8:$C --load $K --save $K --save-hf /tmp/scale-hf;\
recompute-none:1:20:--model qwen2.5-1.5b --micro-batch-size 2;\
recompute-selective:1:20:--model qwen2.5-1.5b --micro-batch-size 2 --recompute selective;\
recompute-full:1:20:--model qwen2.5-1.5b --micro-batch-size 2 --recompute full;\
7b-none:2:20:--model qwen2.5-7b --micro-batch-size 1 --tp 2 --sequence-parallel;\
7b-selective:2:20:--model qwen2.5-7b --micro-batch-size 1 --tp 2 --sequence-parallel --recompute selective;\
7b-full:2:20:--model qwen2.5-7b --micro-batch-size 1 --tp 2 --sequence-parallel --recompute full;\
7b-none-f32w:2:20:--model qwen2.5-7b --micro-batch-size 1 --tp 2 --sequence-parallel --no-bf16-weights;\
7b-pp2:2:10:--model qwen2.5-7b --micro-batch-size 1 --pp 2 --global-batch-size 32 --log-interval 1;\
7b-pp2-15-13:2:10:--model qwen2.5-7b --micro-batch-size 1 --pp 2 --decoder-last-pipeline-num-layers 13 \
--global-batch-size 32 --log-interval 1;\
7b-pp2-f32w:2:10:--model qwen2.5-7b --micro-batch-size 1 --pp 2 --global-batch-size 32 --log-interval 1 \
--no-bf16-weights;\
7b-pp2-gb128:2:8:--model qwen2.5-7b --micro-batch-size 1 --pp 2 --global-batch-size 128 --log-interval 1;\
7b-pp2-gb128-f32w:2:8:--model qwen2.5-7b --micro-batch-size 1 --pp 2 --global-batch-size 128 --log-interval 1 \
--no-bf16-weights;\
7b-pp2-sft-gb128:2:8:--model qwen2.5-7b --micro-batch-size 1 --pp 2 --global-batch-size 128 --log-interval 1 \
--data .gpu/sft_packed.json;\
7b-pp2-15-13-gb128:2:8:--model qwen2.5-7b --micro-batch-size 1 --pp 2 --decoder-last-pipeline-num-layers 13 \
--global-batch-size 128 --log-interval 1;\
7b-dp2:2:10:--model qwen2.5-7b --micro-batch-size 1 --distributed-optimizer --global-batch-size 32 --log-interval 1;\
3b-one:1:20:--model qwen2.5-3b --micro-batch-size 1;\
3b-one-f32w:1:20:--model qwen2.5-3b --micro-batch-size 1 --no-bf16-weights;\
3b-dp2:2:20:--model qwen2.5-3b --micro-batch-size 1;3b-dp2-f32w:2:20:--model qwen2.5-3b --micro-batch-size 1 --no-bf16-weights;\
cp1:1:20:--model qwen2.5-0.5b --micro-batch-size 1 --seq-length 16384;\
cp2:2:20:--model qwen2.5-0.5b --micro-batch-size 1 --seq-length 16384 --cp 2;\
cp-long:2:20:--model qwen2.5-0.5b --micro-batch-size 1 --seq-length 32768 --cp 2 --data .gpu/chat_long \
--global-batch-size 2 --eval-interval 0"
  if [ -z "${SCALE_ONLY:-}" ] || [[ " $SCALE_ONLY " == *" ckpt-a "* ]]; then rm -rf "$K" /tmp/scale-hf; fi  # ckpt-a's
  torchruns scale "${SCALE_ONLY:-}" "$SCALE"
  if [ -d /tmp/scale-hf ]; then  # --save-hf at DP=2 against the checkpoint saved with it, converted
    run scale-hf-exact bash -c "python3 -m train.convert mcore-to-hf $K /tmp/scale-hf-converted && \
python3 bench/scale_report.py --same-weights /tmp/scale-hf /tmp/scale-hf-converted"
  fi
  python3 bench/scale_report.py "$OUT" | tee "$OUT/scale.md"
  echo "scale stage: $SECONDS s" ;;
cores)
  shift
  { grep -m1 "model name" /proc/cpuinfo; nproc; free -g | head -2; } | tee "$OUT/cores-host.txt"
  python3 bench/cores.py --out "$OUT/cores.json" "$@" 2>&1 | tee "$OUT/cores.log"
  ;;
moe)
  device "$OUT/moe_device.txt"
  # The Qwen3-30B-A3B shape with fewer layers (random init: its 48 layers need ~490 GB of float32 weights,
  # gradients and AdamW). ep1/ep2: 2 layers on two GPUs, experts on both (EP=1) against split over them
  # (EP=2), 50 steps, same seed and data; one/two-ep2: 4 layers on one GPU, and on two with EP=2;
  # one-sequential: one's experts one after another (--no-moe-grouped-gemm); two-ep2-mb4: two-ep2 at
  # micro batch 4 (global batch 8: no accumulation); eight-ep2-mb2: 8 layers at micro batch 2 (71 GiB a
  # GPU: the most that fits an 80 GB H100); sft-sdpa/sft-te and pretrain-te: packed SFT rows and
  # pretraining on each attention path (te: needs Transformer Engine).
  # NAME:PROCESSES:STEPS:ARGS (MOE_ONLY="name ..." runs only those).
  D="--data .gpu/pretrain_blend.txt --seq-length 4096 --global-batch-size 8 --num-workers 2 --warmup-iters 5 --lr 3e-4"
  Q="--model qwen3-30b-a3b --micro-batch-size 1 --attention sdpa"
  QT="--model qwen3-30b-a3b --micro-batch-size 1 --attention te --num-layers 4"
  MOE="ep1:2:50:$Q --num-layers 2 --log-interval 1;ep2:2:50:$Q --num-layers 2 --ep 2 --log-interval 1;\
one:1:20:$Q --num-layers 4;one-sequential:1:20:$Q --num-layers 4 --no-moe-grouped-gemm;\
two-ep2:2:20:$Q --num-layers 4 --ep 2;two-ep2-mb4:2:20:$Q --num-layers 4 --ep 2 --micro-batch-size 4;\
eight-ep2-mb2:2:20:$Q --num-layers 8 --ep 2 --micro-batch-size 2;sft-sdpa:1:20:$Q --num-layers 4 --data .gpu/sft_packed.json;\
sft-te:1:20:$QT --data .gpu/sft_packed.json;pretrain-te:1:20:$QT"
  torchruns moe "${MOE_ONLY:-}" "$MOE"
  python3 bench/moe_report.py "$OUT" | tee "$OUT/moe.md"
  echo "moe stage: $SECONDS s" ;;
*)
  echo "unknown stage $stage" >&2; exit 2 ;;
esac
