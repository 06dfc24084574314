"""te.json and its table from what `bench/gpu.sh te` leaves in a folder.

    python3 bench/te_report.py bench/results/gpu        # → bench/results/gpu/te.json, a table on stdout

Each run is a te-NAME.jsonl (the trainer's --log-json) and te-NAME.log (the command line first,
dynamo's "Recompiling function" lines among the output). Rates are steady state (the intervals
after iteration 10, as bench/gpu_table.py); first_step_s is iteration 1's step, compiling included;
loss_at_end the last interval's mean loss. auto_picks: what `--attention auto` resolves to on a
CUDA machine with Transformer Engine as te_device.txt records it; packed_parity: bench/train_gpu.py packed.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import sys

from gpu_table import WARM


def option(argv: list[str], flag: str, default=None):
    return argv[argv.index(flag) + 1] if flag in argv else default


def run(jsonl: str) -> dict:
    name = os.path.basename(jsonl).removeprefix("te-").removesuffix(".jsonl")
    log = jsonl.removesuffix(".jsonl") + ".log"
    text = open(log).read() if os.path.exists(log) else ""
    argv = shlex.split(text.splitlines()[0].lstrip("$ ")) if text else []
    with open(jsonl) as f:
        records = [r for r in map(json.loads, f) if "loss" in r]
    seconds = tokens = 0.0
    mfu_per_token, previous = None, 0
    for r in records:
        if previous >= WARM:
            elapsed = r["step_ms"] * (r["iteration"] - previous) / 1000
            seconds += elapsed
            tokens += r["tokens_per_s"] * elapsed
            mfu_per_token = r["mfu"] / r["tokens_per_s"] if "mfu" in r else None
        previous = r["iteration"]
    rate = tokens / seconds if seconds else None
    data = option(argv, "--data", "")
    return {
        "name": name,
        "model": option(argv, "--model", "tiny"),
        "attention": option(argv, "--attention", "auto"),
        "fp8": option(argv, "--fp8"),
        "packed": "sft_packed" in data,
        "steps": previous,
        "tokens_per_s": round(rate, 1) if rate else None,
        "mfu": round(rate * mfu_per_token, 4) if rate and mfu_per_token else None,
        "max_memory_gib": round(max(r.get("max_memory_gib", 0) for r in records), 2) if records else None,
        "first_step_s": round(records[0]["step_ms"] / 1000, 1) if records else None,
        "loss_at_end": round(records[-1]["loss"], 4) if records else None,
        "recompiles": len(re.findall(r"Recompiling function", text)),
    }


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "bench/results/gpu"
    runs = [run(p) for p in sorted(glob.glob(os.path.join(out, "te-*.jsonl")))]
    facts = os.path.join(out, "te_device.txt")
    device = open(facts).read().strip() if os.path.exists(facts) else None
    te = re.search(r"transformer-engine (\S+)", device or "")
    picks = None
    if te:
        from qwen_data_train.model import resolve_attention
        installed = te.group(1) != "None"
        picks = {"bf16": resolve_attention("auto", cuda=True, te_installed=installed),
                 "float32": resolve_attention("auto", cuda=True, fp32=True, te_installed=installed)}
    parity = os.path.join(out, "te_packed_parity.json")
    report = {
        "device": device.splitlines()[0] if device else None,
        "software": device.splitlines()[1] if device and len(device.splitlines()) > 1 else None,
        "auto_picks": {k: {"attention": a, "why": why} for k, (a, why) in picks.items()} if picks else None,
        "runs": runs,
        "packed_parity": json.load(open(parity)) if os.path.exists(parity) else None,
    }
    with open(os.path.join(out, "te.json"), "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    head = ["name", "attention", "fp8", "packed", "steps", "tokens_per_s", "mfu", "max_memory_gib", "first_step_s",
            "loss_at_end", "recompiles"]
    print("| " + " | ".join(head) + " | vs sdpa |")
    print("|" + "---|" * (len(head) + 1))
    by_name = {r["name"]: r for r in runs}
    for r in runs:
        base = by_name.get(re.sub(r"-te\b.*", "-sdpa", r["name"]))
        ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:.3f}x" if base and base is not r and r["tokens_per_s"] \
            and base["tokens_per_s"] else "-"
        print("| " + " | ".join(str(r[k]) for k in head) + f" | {ratio} |")
    if report["packed_parity"]:
        print("packed parity:", json.dumps(report["packed_parity"]))


if __name__ == "__main__":
    main()
