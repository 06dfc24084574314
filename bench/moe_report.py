"""moe.json and its table from what `bench/gpu.sh moe` leaves in one folder or several (one a machine).

    python3 bench/moe_report.py bench/results/gpu                  # → bench/results/gpu/moe.json, a table on stdout
    python3 bench/moe_report.py --out bench/results/gpu/moe.json bench/results/gpu/moe-h200x2 bench/results/gpu/moe-h100

Each run is a moe-NAME.jsonl (the trainer's --log-json) and moe-NAME.log (the command line first), read as
scale_report reads its runs (steady-state rates per GPU; MFU in the trainer's two counts, of the active
parameters; the machine fields), plus the most loaded expert against the mean (expert_load_max, the run's
largest). expert_parallel:
ep2's losses against ep1's step by step (same seed, data and global batch; experts split over the two GPUs
against replicated on both), from the first folder that holds both. Each run names its folder's machine
(the first line of moe_device.txt); `device` lists them all.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

from gpu_table import CARD, MFU
from scale_report import card, device_of, markdown, max_rel_diff, records, reports, run


def report(folder: str) -> dict:
    device = device_of(folder, "moe")
    names = sorted(os.path.basename(p).removeprefix("moe-").removesuffix(".log")
                   for p in glob.glob(os.path.join(folder, "moe-*.log")))
    runs = []
    for name in names:
        rows = records(folder, name, "moe")
        if rows:
            loads = [r["expert_load_max"] for r in rows if r.get("expert_load_max") is not None]
            runs.append({**run(folder, name, "moe"), "gpus": None,
                         "expert_load_max": round(max(loads), 3) if loads else None,
                         "device": card(device)})
            runs[-1]["gpus"] = runs[-1]["dp"] * runs[-1]["tp"] * runs[-1]["pp"]
    diff, steps = max_rel_diff(records(folder, "ep2", "moe"), records(folder, "ep1", "moe"))
    return {"device": device, "runs": runs, "expert_parallel": {"max_rel_loss_diff": diff, "steps": steps}}


def table(result: dict) -> str:
    head = ["name", "device", "model", "num_layers", "gpus", "ep", "tokens_per_s_per_gpu", *MFU, "max_memory_gib",
            "expert_load_max", "loss_at_end", "error", *CARD]
    return "\n".join([str(result["device"]), *markdown(result["runs"], head), json.dumps(result["expert_parallel"])])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folders", nargs="+")
    p.add_argument("--out", help="where moe.json goes (default: in the folder)")
    args = p.parse_args()
    result = reports(args.folders, report)
    with open(args.out or os.path.join(args.folders[0], "moe.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
