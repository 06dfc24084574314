"""Six short CPU train runs (one process; TP 2, PP 2, DP 2 on packed SFT, a MoE over EP 2, CP 2 under
torchrun) whose per-step losses and gradient norms, as the log prints them, a refactor of the train
stage must leave bit-identical:

    python3 tests/_steps.py before.json; (change); python3 tests/_steps.py after.json; cmp before.json after.json

(`python3 tests/_steps.py OUT.json one tp2` runs some of them.)"""
import json
import sys
import tempfile
from pathlib import Path

from _train import run_train, train_prefixes

TRAIN = ["--seq-length", "128", "--micro-batch-size", "2", "--global-batch-size", "4",
         "--log-interval", "1", "--num-workers", "0", "--lr", "1e-2", "--min-lr", "1e-3", "--warmup-iters", "1",
         "--train-iters", "4"]
d = train_prefixes(Path(tempfile.mkdtemp()))
pre, sft = ["--data", f"{d}/pretrain_blend.json"], ["--data", f"{d}/sft_blend.json"]
RUNS = {
    "one": (1, pre + ["--model", "tiny"]),
    "tp2": (2, pre + ["--model", "tiny", "--tp", "2"]),
    "pp2": (2, pre + ["--model", "tiny", "--pp", "2"]),
    "dp2-sft": (2, sft + ["--model", "tiny"]),
    "moe-ep2": (2, sft + ["--model", "tiny-qwen3-moe", "--ep", "2"]),
    "cp2": (2, pre + ["--model", "tiny-qwen3", "--cp", "2"]),
}
only = sys.argv[2:] or list(RUNS)
out = {}
for name in only:
    nproc, args = RUNS[name]
    rows = ["--seq-length", "256"] if args[1].endswith("sft_blend.json") else []  # the packed rows' length
    records, _ = run_train(TRAIN + args + rows, f"{d}/{name}.jsonl", nproc=nproc)
    out[name] = [(r["iteration"], repr(r["loss"]), repr(r["grad_norm"])) for r in records]
    print(name, out[name][-1], flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
