"""GPU train runs read from their --log-json files: records.json, and the table of a bench/gpu.sh stage.

    python3 bench/records.py $OUT --append                     # every $OUT/*.jsonl into bench/results/gpu/records.json
    python3 bench/records.py 3b-h200=$OUT/te-fp8-3b-bf16.jsonl --append      # one run, named
    python3 bench/records.py --table $OUT/speed-*.jsonl        # a markdown table of runs (nothing written)
    python3 bench/records.py --table --against $OUT/tp1.jsonl $OUT/tp2.jsonl # and each one's losses against tp1's

A run is NAME.jsonl (the trainer's --log-json: a line per log interval, validation lines, the summary
line last) and, beside it, NAME.log (bench/gpu.sh's: the command line first, after "$ "). What the run
was (RUN) and its machine (MACHINE: the GPU's name, UUID, power limit, clocks and temperature under
load, the share of a step its kernels ran, the CPU model) are its summary line's; rates are steady
state: the intervals after iteration 10 (after 1 in runs of 10 steps or fewer), weighted by their time;
loss_at_end is the last interval's mean loss. A field the run did not log is null (logs older than the
summary's fields or the two MFU counts), never read off the command line, which the record carries as
`command` (null without a .log). --append merges into --out by name: a run recorded again replaces its
record.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys

WARM = 10  # iterations left out of the rates: 1 compiles, the first interval warms up
MFU = ("mfu_causal", "mfu_full")
RUN = ("model", "gpus", "fp8", "packed", "ep", "bf16_weights")  # what the trainer's summary line says of its run
# train/metrics.py's `machine`, `clock_report` and the kernels' share of a step (`Metrics.measure`)
MACHINE = ("gpu_name", "gpu_uuid", "power_limit_w", "sm_clock_mhz", "max_sm_clock_mhz", "power_draw_w",
           "power_capped_share", "slowdown_share", "gpu_busy_share", "mem_clock_mhz", "temperature_c", "cpu_model")
FIELDS = ("name", *RUN, "tokens_per_s", "tokens_per_s_per_gpu", "steps", "loss_at_end", *MFU, *MACHINE, "command")
INTERVAL = ("iteration", "loss", "step_ms", "tokens_per_s")  # what every log interval holds
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "gpu", "records.json")


class RecordError(ValueError):
    """A log that is not a train run's --log-json, or runs that cannot be told apart."""


def read_log(path: str) -> tuple[list[dict], dict]:
    """(the interval records, the summary line or {}) of a --log-json file."""
    intervals, summary = [], {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as e:
                raise RecordError(f"{path}:{number}: not JSON ({e})") from None
            if not isinstance(entry, dict) or not ({"summary", "loss", "valid_loss"} & entry.keys()):
                raise RecordError(f"{path}:{number}: not a line of the trainer's --log-json")
            if entry.get("summary"):
                summary = entry
            elif "loss" in entry:
                lacking = [k for k in INTERVAL if not isinstance(entry.get(k), (int, float))]
                if lacking:
                    raise RecordError(f"{path}:{number}: a log interval without {', '.join(lacking)}")
                intervals.append(entry)
    return intervals, summary


def steady(intervals: list[dict], warm: int = WARM) -> dict:
    """tokens_per_s and each MFU over the intervals after iteration `warm`, each weighted by its time;
    None where there are none, or the intervals lack the field."""
    fields = ("tokens_per_s", *MFU)
    seconds, sums, previous = 0.0, dict.fromkeys(fields, 0.0), 0
    for r in intervals:
        if previous >= warm:
            elapsed = r["step_ms"] * (r["iteration"] - previous) / 1000
            seconds += elapsed
            for k in fields:
                sums[k] = sums[k] + r[k] * elapsed if sums[k] is not None and k in r else None
        previous = r["iteration"]
    return {k: v / seconds if seconds and v is not None else None for k, v in sums.items()}


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


def baseline_name(name: str) -> str:
    """The run `name` is set against in a table: FP8 against bf16, TE's attention against PyTorch's, in its
    round (-rN)."""
    name = re.sub(r"-(tensorwise|delayed|blockwise)((?:-r\d+)?)$", r"-bf16\2", name)
    return re.sub(r"-te((?:-r\d+)?)$", r"-sdpa\1", name)


def losses(jsonl: str) -> dict[int, float]:
    return {r["iteration"]: r["loss"] for r in read_log(jsonl)[0]}


def max_rel_diff(mine: dict[int, float], reference: dict[int, float]) -> float | None:
    """The largest |loss - reference| / reference over the iterations both logged."""
    common = mine.keys() & reference.keys()
    return max(abs(mine[i] - reference[i]) / reference[i] for i in common) if common else None


def table(paths: list[tuple[str, str]], against: str | None = None) -> str:
    """Markdown: a row a run, its ratio to its baseline_name run among them, and with `against` the
    largest relative loss difference from that run's losses."""
    def cell(value, form):
        return "-" if value is None else form.format(value)

    rows = {name: (record(name, path), path) for name, path in paths}
    head = ["run", "GPUs", "steps", "tokens/s", "a GPU", "vs base", "MFU causal", "MFU full", "peak GiB", "loss @1",
            "loss at end", "busy", "SM MHz", "recompiles"] + (["max rel. loss diff"] if against else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    reference = losses(against) if against else None
    for name, (r, path) in rows.items():
        intervals = read_log(path)[0]
        base = rows.get(baseline_name(name), (None,))[0]
        log = path.removesuffix(".jsonl") + ".log"
        recompiles = open(log).read().count("Recompiling function") if os.path.exists(log) else None
        cells = [name, cell(r["gpus"], "{}"), str(r["steps"]), cell(r["tokens_per_s"], "{:,.0f}"),
                 cell(r["tokens_per_s_per_gpu"], "{:,.0f}"),
                 f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base and base is not r and r["tokens_per_s"]
                 and base["tokens_per_s"] else "-",
                 cell(r["mfu_causal"], "{:.1%}"), cell(r["mfu_full"], "{:.1%}"),
                 cell(max((i.get("max_memory_gib", 0) for i in intervals), default=None), "{:.1f}"),
                 cell(intervals[0]["loss"] if intervals[0]["iteration"] == 1 else None, "{:.4f}"),
                 f"{r['loss_at_end']:.4f}", cell(r["gpu_busy_share"], "{:.2f}"), cell(r["sm_clock_mhz"], "{:.0f}"),
                 cell(recompiles, "{}")]
        if against:
            cells.append(cell(max_rel_diff(losses(path), reference), "{:.3%}"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


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
    p.add_argument("--table", action="store_true", help="print the runs' table instead of recording them")
    p.add_argument("--against", metavar="JSONL", help="with --table: each run's losses against this run's")
    args = p.parse_args(argv)
    try:
        if args.table:
            print(table(runs(args.logs), args.against))
            return 0
        records = [record(name, path) for name, path in runs(args.logs)]
        old = existing(args.out) if args.append and os.path.exists(args.out) else []
    except (RecordError, OSError) as e:
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
