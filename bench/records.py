"""records.json: one record per GPU train run, from the runs' --log-json files.

    python3 bench/records.py bench/results/gpu/te-h100 bench/results/gpu/scale-h200x2   # every *.jsonl in them
    python3 bench/records.py 3b-h200=bench/results/gpu/te-h200/te-fp8-3b-bf16.jsonl --append

A run is NAME.jsonl (the trainer's --log-json: a line per log interval, validation lines, and the
summary line last) and, beside it, NAME.log (bench/gpu.sh's: the command line first, after "$ ").
Its record's name is NAME, or the one given as NAME=PATH. What the run was (model, gpus, fp8, packed,
ep, bf16_weights) and the machine (gpu_table.MACHINE: the GPU's name, UUID, power limit, clocks and
temperature under load, the CPU model) are its summary line's; rates are steady state as the reports
take them (bench/gpu_table.py: the intervals after iteration 10, or after 1 in runs of 10 steps or
fewer): tokens_per_s the job's,
tokens_per_s_per_gpu that over its gpus; steps the last interval's iteration, loss_at_end that
interval's mean loss. A field the run did not log is null (logs older than the summary's fields, or
than the two MFU counts): never inferred from the command line, which the record carries as
`command` (null without a .log).

--append merges into the --out file by name: a run recorded again replaces its record.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

from gpu_table import MACHINE, MFU, WARM, LogError, read_log, steady

RUN = ("model", "gpus", "fp8", "packed", "ep", "bf16_weights")  # what the trainer's summary line says of its run
FIELDS = ("name", *RUN, "tokens_per_s", "tokens_per_s_per_gpu", "steps", "loss_at_end", *MFU, *MACHINE, "command")
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "gpu", "records.json")


class RecordError(ValueError):
    """A log that is not a train run's --log-json, or runs that cannot be told apart."""


def command_of(jsonl: str) -> str | None:
    """The command line bench/gpu.sh kept as the first line of the run's .log, if there is one."""
    log = jsonl.removesuffix(".jsonl") + ".log"
    if not os.path.exists(log):
        return None
    with open(log) as f:
        first = f.readline().rstrip("\n")
    return first[2:] if first.startswith("$ ") else None


def record(name: str, jsonl: str) -> dict:
    """The record of one run (RecordError for a log without a single interval: a run that failed first)."""
    intervals, summary = read_log(jsonl)
    if not intervals:
        raise RecordError(f"{jsonl}: no log interval (the run stopped before its first; see its .log)")
    last = intervals[-1]["iteration"]
    rates = steady(intervals, WARM if last > WARM else 1)
    gpus, rate = summary.get("gpus"), rates["tokens_per_s"]
    found = {
        "name": name, **{k: summary.get(k) for k in RUN},
        "tokens_per_s": round(rate, 1) if rate else None,
        "tokens_per_s_per_gpu": round(rate / gpus, 1) if rate and gpus else None,
        "steps": last,
        "loss_at_end": round(intervals[-1]["loss"], 4),
        **{k: round(rates[k], 4) if rates[k] is not None else None for k in MFU},
        **{k: summary.get(k) for k in MACHINE},
        "command": command_of(jsonl),
    }
    return {k: found[k] for k in FIELDS}


def runs(arguments: list[str]) -> list[tuple[str, str]]:
    """(name, jsonl) of each argument: NAME=PATH, a .jsonl file, or a folder (its *.jsonl)."""
    found = []
    for argument in arguments:
        name, _, path = argument.partition("=") if "=" in argument and not os.path.exists(argument) \
            else ("", "", argument)
        if os.path.isdir(path):
            if name:
                raise RecordError(f"{argument}: NAME=PATH names one .jsonl file, not a folder")
            found += [(os.path.basename(p).removesuffix(".jsonl"), p)
                      for p in sorted(glob.glob(os.path.join(path, "*.jsonl")))]
        elif os.path.isfile(path):
            found.append((name or os.path.basename(path).removesuffix(".jsonl"), path))
        else:
            raise RecordError(f"{path}: no such file or folder")
    seen: dict[str, str] = {}
    for name, path in found:
        if name in seen:
            raise RecordError(f"two runs named {name}: {seen[name]} and {path} (give one as NAME=PATH)")
        seen[name] = path
    return found


def existing(path: str) -> list[dict]:
    """The records of a records.json."""
    with open(path) as f:
        try:
            old = json.load(f)
        except json.JSONDecodeError as e:
            raise RecordError(f"{path}: not JSON ({e})") from None
    if not isinstance(old, list) or not all(isinstance(r, dict) and "name" in r for r in old):
        raise RecordError(f"{path}: not a list of records with names")
    return old


def merged(old: list[dict], new: list[dict]) -> list[dict]:
    """`old` with each of `new` in place of the record of its name, or after them."""
    by_name = {r["name"]: r for r in old}
    by_name.update({r["name"]: r for r in new})
    return list(by_name.values())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logs", nargs="+", metavar="DIR_OR_JSONL", help="runs: folders, .jsonl files, NAME=PATH")
    p.add_argument("--out", default=OUT, help="the records (default: bench/results/gpu/records.json)")
    p.add_argument("--append", action="store_true", help="merge into --out by name instead of replacing it")
    args = p.parse_args(argv)
    try:
        records = [record(name, path) for name, path in runs(args.logs)]
        old = existing(args.out) if args.append and os.path.exists(args.out) else []
    except (RecordError, LogError, OSError) as e:
        print(f"records.py: {e}", file=sys.stderr)
        return 1
    result = merged(old, records)
    tmp = args.out + ".tmp"  # a complete file or none: written whole, then moved over the old one
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    os.replace(tmp, args.out)
    print(f"{len(records)} runs recorded, {len(result)} in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
