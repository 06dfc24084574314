# Sourced by m.sh. R: results folder (packed into $OUT/$TAG.tgz). ROOT: the repo copy; BASE: HEAD's train/.
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
ROOT=$(pwd); BASE=$ROOT/.gpu08s/base
export PYTHONPATH=/tmp/site:$ROOT
left() { echo $((LIMIT - SECONDS)); }
pack() { tar czf $OUT/$TAG.tgz.part -C $R . && mv $OUT/$TAG.tgz.part $OUT/$TAG.tgz; }
filt() { grep -v -E "Warning|warnings\.warn|\]:\[W|registered at|fallthrough"; }
summ() {  # JSONL: rates over iterations 11-30
python3 - "$@" <<'PY'
import json, os, sys
for path in sys.argv[1:]:
    rows = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
    summary = [r for r in rows if r.get("summary")]
    rows = [r for r in rows if "loss" in r]
    late = [r for r in rows if r["iteration"] > 10]
    if not late:
        print(os.path.basename(path), "no rows"); continue
    t = sum(r["step_ms"] * 5 for r in late)
    tok = sum(r["tokens_per_s"] * r["step_ms"] * 5 for r in late) / t
    mfu = sum(r["mfu_causal"] * r["step_ms"] * 5 for r in late) / t
    clk = summary[-1].get("sm_clock_mhz") if summary else None
    print(os.path.basename(path), f"tok/s {tok:.0f} mfu {mfu:.4f} step", " ".join(f"{r['step_ms']:.1f}" for r in late),
          f"peak {max(r['max_memory_gib'] for r in rows):.2f} loss@{rows[-1]['iteration']} {rows[-1]['loss']:.4f} clk {clk}")
PY
}
B="--model qwen2.5-0.5b --seq-length 4096 --global-batch-size 8 --micro-batch-size 4 --num-workers 2 --warmup-iters 10 --lr 3e-4"
SFT=.gpu/sft_packed.json
PT=.gpu/code
rate() {  # NAME TREE(new|base) DATA ARGS...: 30 iterations, rates over 11-30
  local name=$1 tree=$2 data=$3; shift 3
  local dir=$ROOT; [ $tree = base ] && dir=$BASE
  local t=$(( $(left) - 3 )); [ $t -gt 95 ] && t=95
  [ $t -lt 50 ] && { echo "== $name skipped at $SECONDS s" | tee $R/$name.log; return; }
  local started=$SECONDS
  echo "\$ python3 -m train $B --data $data --train-iters 30 --log-interval 5 $* --log-json $name.jsonl   # tree: $tree" > $R/$name.log
  { cd $dir && TORCHINDUCTOR_CACHE_DIR=/tmp/ind-$tree timeout $t python3 -m train $B --data $data --train-iters 30 --log-interval 5 "$@" --log-json $R/$name.jsonl 2>&1
    echo "exit status $? after $((SECONDS - started)) s"; cd $ROOT; } | filt >> $R/$name.log
  grep -E "^train from|^attention|Error|error:|exit status" $R/$name.log | cut -c1-200
  summ $R/$name.jsonl
  pack
}
