"""scale.json and its table from what `bench/gpu.sh scale` leaves in one folder or several (one a machine).

    python3 bench/scale_report.py bench/results/gpu                 # → bench/results/gpu/scale.json, a table on stdout
    python3 bench/scale_report.py --out bench/results/gpu/scale.json bench/results/gpu/scale-h200x2 \
        bench/results/gpu/scale-h100x2
    python3 bench/scale_report.py --same-weights HF_A HF_B          # exit 1 unless two HF folders hold equal tensors

Each run is a scale-NAME.jsonl (the trainer's --log-json) and scale-NAME.log (the command line first).
Rates are steady state (intervals after iteration 10, as bench/gpu_table.py, MFU in its two counts; a run
of fewer steps: after iteration 1) per GPU; the machine fields the log's summary line's (null in logs older than
them); memory the run's peak (the trainer logs the most of any GPU; before 2026-11-26, rank 0's).
Each run names its folder's machine (the first line of scale_device.txt). distributed_optimizer: dp2-distopt's losses
against dp2-plain's, step by step; checkpoint: ckpt-a/b/c (saved at DP=2, resumed at DP=1, then at DP=2)
against ckpt-ref uninterrupted; sequence_parallel_compiled: sp-layers against sp-swiglu; context_parallel:
cp2 against cp1, and cp-long; each from the first folder that holds its runs.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shlex
import sys

from gpu_table import CARD, MACHINE, MFU, WARM, read, steady


def option(argv: list[str], flag: str, default=None):
    where = [i for i, word in enumerate(argv) if word == flag]
    return argv[where[-1] + 1] if where else default


def records(folder: str, name: str, stage: str = "scale") -> list[dict]:
    return log(folder, name, stage)[0]


def log(folder: str, name: str, stage: str = "scale") -> tuple[list[dict], dict]:
    """`gpu_table.read` of a run's log; none: no records, no machine."""
    path = os.path.join(folder, f"{stage}-{name}.jsonl")
    return read(path) if os.path.exists(path) else ([], dict.fromkeys(MACHINE))


def run(folder: str, name: str, stage: str = "scale") -> dict:
    text = open(os.path.join(folder, f"{stage}-{name}.log")).read()
    argv = shlex.split(text.splitlines()[0].lstrip("$ "))
    rows, where = log(folder, name, stage)
    nproc = int(option(argv, "--nproc-per-node", 1))
    tp, pp, cp = int(option(argv, "--tp", 1)), int(option(argv, "--pp", 1)), int(option(argv, "--cp", 1))
    warm = WARM if rows and rows[-1]["iteration"] > WARM else 1
    rates = steady(rows, warm)
    rate = rates["tokens_per_s"]
    state = re.search(r"([\d.]+) GiB of state a GPU", text)
    return {
        "name": name, "model": option(argv, "--model", "tiny"), "num_layers": option(argv, "--num-layers"),
        "tp": tp, "pp": pp, "dp": nproc // (tp * pp * cp), "cp": cp, "ep": int(option(argv, "--ep", 1)),
        "distributed_optimizer": "--distributed-optimizer" in argv,
        # the run's first line names its weights (logs before it did: the flag, then off by default)
        "bf16_weights": "--bf16-weights" in argv or "bf16 weights split from their float32 masters (" in text,
        "recompute": option(argv, "--recompute"),
        "sequence_parallel": "--sequence-parallel" in argv,
        "compile": option(argv, "--compile", "auto"),
        "seq_length": int(option(argv, "--seq-length", 4096)),
        "global_batch": int(option(argv, "--global-batch-size", 8)),
        "steps": rows[-1]["iteration"] if rows else 0,
        "tokens_per_s_per_gpu": round(rate / nproc, 1) if rate else None,
        **{k: round(rates[k], 4) if rates[k] else None for k in MFU},
        "max_memory_gib": round(max(r.get("max_memory_gib", 0) for r in rows), 2) if rows else None,
        "optimizer_state_gib": float(state.group(1)) if state else None,
        "loss_at_end": round(rows[-1]["loss"], 4) if rows else None,
        "error": None if rows and "exit status 0" in text else failure(text),
        **where,
    }


def failure(log: str) -> str:
    """What ended a failed run: its first Python error line (a rank's), else the log's last line."""
    lines = log.strip().splitlines()
    return next((line for line in lines if re.match(r"[\w.]*(Error|Exception): ", line)), lines[-1])[:300]


def max_rel_diff(mine: list[dict], reference: list[dict]) -> tuple[float | None, int]:
    """Largest |loss - reference| / reference over the iterations both logged; → (it, how many)."""
    theirs = {r["iteration"]: r["loss"] for r in reference}
    diffs = [abs(r["loss"] - theirs[r["iteration"]]) / theirs[r["iteration"]] for r in mine if r["iteration"] in theirs]
    return (round(max(diffs), 6) if diffs else None), len(diffs)


def device_of(folder: str, stage: str) -> str | None:
    """What `bench/gpu.sh` wrote of the folder's machine (STAGE_device.txt), if anything."""
    path = os.path.join(folder, f"{stage}_device.txt")
    return open(path).read().strip() if os.path.exists(path) else None


def card(device: str | None) -> str | None:
    """The GPU's name, from the first line of a device description."""
    return device.splitlines()[0].split(",")[0] if device else None


def report(folder: str) -> dict:
    names = sorted(os.path.basename(p).removeprefix("scale-").removesuffix(".log")
                   for p in glob.glob(os.path.join(folder, "scale-*.log")))
    device = device_of(folder, "scale")
    runs = [{**run(folder, n), "device": card(device)}
            for n in names if os.path.exists(os.path.join(folder, f"scale-{n}.jsonl"))]
    diff, steps = max_rel_diff(records(folder, "dp2-distopt"), records(folder, "dp2-plain"))
    resumed = records(folder, "ckpt-b") + records(folder, "ckpt-c")
    ck_diff, ck_steps = max_rel_diff(resumed, records(folder, "ckpt-ref"))
    sp_diff, sp_steps = max_rel_diff(records(folder, "sp-layers"), records(folder, "sp-swiglu"))
    exact = os.path.join(folder, "scale-hf-exact.log")
    return {
        "device": device,
        "runs": runs,
        "distributed_optimizer": {"max_rel_loss_diff": diff, "steps": steps},
        "checkpoint_dp2_dp1_dp2": {"resumed_iterations": [r["iteration"] for r in resumed],
                                   "max_rel_loss_diff": ck_diff, "steps": ck_steps,
                                   "save_hf_exact": ("same weights" in open(exact).read()) if os.path.exists(exact)
                                   else None},
        "sequence_parallel_compiled": {"max_rel_loss_diff": sp_diff, "steps": sp_steps},
        "context_parallel": context_parallel(folder, runs),
    }


def reports(folders: list[str], one=None) -> dict:
    """One report of several folders (`one`: the report of a folder, this module's `report` unless
    given): every run, every machine, each comparison from the first folder that made it."""
    parts = [(one or report)(folder) for folder in folders]

    def first(key: str):
        made = [part[key] for part in parts if part[key] and part[key].get("steps")]
        return made[0] if made else parts[0][key]
    return {"device": "\n".join(part["device"] for part in parts if part["device"]) or None,
            "runs": [r for part in parts for r in part["runs"]],
            **{key: first(key) for key in parts[0] if key not in ("device", "runs")}}


def context_parallel(folder: str, runs: list[dict]) -> dict | None:
    """cp2's losses against cp1's (the same rows on one GPU), and the long packed SFT run (cp-long)."""
    diff, steps = max_rel_diff(records(folder, "cp2"), records(folder, "cp1"))
    long = next((r for r in runs if r["name"] == "cp-long"), None)
    if steps == 0 and long is None:
        return None
    return {"max_rel_loss_diff": diff, "steps": steps, "long_seq_length": long and long["seq_length"],
            "long_tokens_per_s_per_gpu": long and long["tokens_per_s_per_gpu"],
            "long_max_memory_gib": long and long["max_memory_gib"]}


def markdown(rows: list[dict], head: list[str]) -> list[str]:
    """The `head` columns of `rows` as the lines of a markdown table."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(str(r[k]) for k in head) + " |" for r in rows]


def table(result: dict) -> str:
    head = ["name", "device", "model", "tp", "pp", "dp", "global_batch", "distributed_optimizer", "bf16_weights",
            "recompute", "compile", "tokens_per_s_per_gpu", *MFU, "max_memory_gib", "optimizer_state_gib",
            "loss_at_end", *CARD]
    rest = {k: v for k, v in result.items() if k not in ("runs", "device")}
    return "\n".join([str(result["device"]), *markdown(result["runs"], head), json.dumps(rest, indent=1)])


def same_weights(a: str, b: str) -> bool:
    from safetensors.torch import load_file

    def tensors(folder):
        out = {}
        for path in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
            out.update(load_file(path))
        return out
    x, y = tensors(a), tensors(b)
    differ = [k for k in x if k not in y or not x[k].equal(y[k])]
    print(f"{len(x)} tensors in {a}, {len(y)} in {b}: " + ("same weights" if not differ and x.keys() == y.keys()
                                                         else f"differ: {differ[:5]}"))
    return not differ and x.keys() == y.keys()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folders", nargs="*")
    p.add_argument("--out", help="where scale.json goes (default: in the first folder)")
    p.add_argument("--same-weights", nargs=2, metavar=("HF_A", "HF_B"))
    args = p.parse_args()
    if args.same_weights:
        return 0 if same_weights(*args.same_weights) else 1
    if not args.folders:
        p.error("name a folder of runs, or --same-weights")
    result = reports(args.folders)
    with open(args.out or os.path.join(args.folders[0], "scale.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
