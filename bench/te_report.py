"""te.json and its table from what `bench/gpu.sh te` leaves in a folder.

    python3 bench/te_report.py bench/results/gpu        # → bench/results/gpu/te.json, a table on stdout
    python3 bench/te_report.py --out bench/results/gpu/te.json bench/results/gpu/te-h100 bench/results/gpu/te-h200

Several folders (runs of several machines): each run names its device, and `device` lists them.

Each run is a te-NAME.jsonl (the trainer's --log-json) and te-NAME.log (the command line first,
dynamo's "Recompiling function" lines among the output). Rates are steady state (the intervals
after iteration 10, as bench/gpu_table.py, MFU in its two counts); the machine fields are the log's
summary line's (null in logs older than them); first_step_s is iteration 1's step, compiling included;
loss_at_end the last interval's mean loss; gpu_busy_share the share of a step the GPU's kernels were busy
(the summary's; in older logs te-NAME.profile's, bench/train_gpu.py profile's, which its recording of the
CPU's ops lowers; near 1 the GPU bounds the step, well below it the host's launches do; null without one). A run named ...-rN (gpu.sh's TE_ROUNDS) is set against the bf16 run of
its own round. auto_picks: what `--attention auto` resolves to on a
CUDA machine with Transformer Engine as te_device.txt records it; packed_parity: bench/train_gpu.py packed.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shlex
from typing import Optional

from gpu_table import CARD, MFU, read, steady


def option(argv: list[str], flag: str, default=None):
    """The value of `flag`'s last occurrence (argparse's rule), or `default`."""
    where = [i for i, word in enumerate(argv) if word == flag]
    return argv[where[-1] + 1] if where else default


def run(jsonl: str) -> dict:
    name = os.path.basename(jsonl).removeprefix("te-").removesuffix(".jsonl")
    log = jsonl.removesuffix(".jsonl") + ".log"
    text = open(log).read() if os.path.exists(log) else ""
    argv = shlex.split(text.splitlines()[0].lstrip("$ ")) if text else []
    records, where = read(jsonl)
    rates = steady(records)
    rate = rates["tokens_per_s"]
    data = option(argv, "--data", "")
    return {
        "name": name,
        "model": option(argv, "--model", "tiny"),
        "attention": option(argv, "--attention", "auto"),
        "fp8": option(argv, "--fp8"),
        "packed": "sft_packed" in data,
        "steps": records[-1]["iteration"] if records else 0,
        "tokens_per_s": round(rate, 1) if rate else None,
        **{k: round(rates[k], 4) if rates[k] else None for k in MFU},
        "max_memory_gib": round(max(r.get("max_memory_gib", 0) for r in records), 2) if records else None,
        "first_step_s": round(records[0]["step_ms"] / 1000, 1) if records else None,
        "loss_at_end": round(records[-1]["loss"], 4) if records else None,
        "recompiles": len(re.findall(r"Recompiling function", text)),
        **where,
        # the run's own (against its unprofiled steps), else a profile's from before the runs measured it
        "gpu_busy_share": where["gpu_busy_share"] or busy_share(jsonl.removesuffix(".jsonl") + ".profile"),
    }


def busy_share(profile: str) -> Optional[float]:
    """The GPU kernels' share of the step in a `train_gpu.py profile` output; None: none there."""
    if not os.path.exists(profile):
        return None
    found = re.search(r"GPU kernels [\d.]+ ms/step \((\d+)%\)", open(profile).read())
    return int(found.group(1)) / 100 if found else None


def baseline_name(name: str) -> str:
    """The run `name` is measured against: FP8 against bf16, TE's attention against PyTorch's, in its round."""
    name = re.sub(r"-(tensorwise|delayed|blockwise)((?:-r\d+)?)$", r"-bf16\2", name)
    return re.sub(r"-te((?:-r\d+)?)$", r"-sdpa\1", name)


def folder(out: str) -> tuple[list[dict], Optional[str], Optional[str], Optional[dict], Optional[dict]]:
    """(runs, device, software, auto_picks, packed_parity) of one folder of the te stage."""
    facts = os.path.join(out, "te_device.txt")
    lines = open(facts).read().strip().splitlines() if os.path.exists(facts) else []
    device, software = (lines + [None, None])[:2]
    runs = [dict(run(p), device=device) for p in sorted(glob.glob(os.path.join(out, "te-*.jsonl")))]
    te = re.search(r"transformer-engine (\S+)", software or "")
    picks = None
    if te:
        from qwen_data_train.plan import Environment, resolve_attention
        where = Environment(cuda=True, te_installed=te.group(1) != "None")
        picks = {kind: dict(zip(("attention", "why"), resolve_attention("auto", where, fp32=fp32)))
                 for kind, fp32 in (("bf16", False), ("float32", True))}
    parity = os.path.join(out, "te_packed_parity.json")
    return runs, device, software, picks, json.load(open(parity)) if os.path.exists(parity) else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folders", nargs="*", default=["bench/results/gpu"])
    p.add_argument("--out", help="te.json here (default: in the first folder)")
    args = p.parse_args()
    report = {"device": None, "software": None, "auto_picks": None, "runs": [], "packed_parity": None}
    devices, software, folder_of = [], [], {}  # a run's baseline is of its own folder (machine and day)
    for out in args.folders:
        runs, device, soft, picks, parity = folder(out)
        report["runs"] += runs
        folder_of.update({id(r): out for r in runs})
        devices += [device] if device and device not in devices else []
        software += [soft] if soft and soft not in software else []
        report["auto_picks"] = report["auto_picks"] or picks
        report["packed_parity"] = report["packed_parity"] or parity
    report["device"] = "; ".join(devices) or None
    report["software"] = "; ".join(software) or None
    with open(args.out or os.path.join(args.folders[0], "te.json"), "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    runs = report["runs"]
    head = ["name", "device", "model", "attention", "fp8", "packed", "steps", "tokens_per_s", *MFU, "max_memory_gib",
            "first_step_s", "loss_at_end", "recompiles", *CARD]
    print("| " + " | ".join(head) + " | vs sdpa / bf16 |")
    print("|" + "---|" * (len(head) + 1))
    by_name = {(folder_of[id(r)], r["name"]): r for r in runs}
    for r in runs:
        base = by_name.get((folder_of[id(r)], baseline_name(r["name"])))
        ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:.3f}x" if base and base is not r and r["tokens_per_s"] \
            and base["tokens_per_s"] else "-"
        cells = [str(r[k]).split(",")[0] for k in head]  # the device's name, not its memory and driver
        print("| " + " | ".join(cells) + f" | {ratio} |")
    if report["packed_parity"]:
        print("packed parity:", json.dumps(report["packed_parity"]))


if __name__ == "__main__":
    main()
