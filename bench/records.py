"""GPU train runs read from their --log-json files: records.json (one record a line), and the table of a bench/gpu.sh
stage (what a record holds: bench/README.md).

    python3 bench/records.py $OUT [NAME=RUN.jsonl] --append   # the runs into bench/results/gpu/records.json
    python3 bench/records.py --table [--against RUN.jsonl] $OUT/speed-*.jsonl  # a markdown table (nothing written)

A run is NAME.jsonl (a line per log interval, validation lines, the summary line last) and, beside it, NAME.log
(bench/gpu.sh's: the command line first, after "$ "). A field the run did not log is null, never read off the command.
"""

import argparse
import glob
import json
import os
import re
import sys

from measure import write_json

WARM = 10  # iterations left out of the rates: 1 compiles, the first interval warms up
MFU = ("mfu_causal", "mfu_full")
RUN = ("model", "gpus", "fp8", "packed", "ep", "bf16_weights")  # what the trainer's summary line says of its run
# train/metrics.py's `machine`, `clock_report` and the kernels' share of a step (`Metrics.measure`)
MACHINE = ("gpu_name", "gpu_uuid", "power_limit_w", "sm_clock_mhz", "max_sm_clock_mhz", "power_draw_w",
           "power_capped_share", "slowdown_share", "gpu_busy_share", "mem_clock_mhz", "temperature_c", "cpu_model")
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
            lacking = [k for k in INTERVAL if not isinstance(entry.get(k), (int, float))]
            if entry.get("summary"):
                summary = entry
            elif "loss" in entry and lacking:
                raise RecordError(f"{path}:{number}: a log interval without {', '.join(lacking)}")
            elif "loss" in entry:
                intervals.append(entry)
    return intervals, summary


def steady(intervals: list[dict], warm: int) -> dict:
    """tokens_per_s and each MFU over the intervals after iteration `warm`, each weighted by its time; None where
    there are none, or the intervals lack the field."""
    seconds, sums, previous = 0.0, dict.fromkeys(("tokens_per_s", *MFU), 0.0), 0
    for r in intervals:
        if previous >= warm:
            elapsed = r["step_ms"] * (r["iteration"] - previous) / 1000
            seconds += elapsed
            sums = {k: v + r[k] * elapsed if v is not None and k in r else None for k, v in sums.items()}
        previous = r["iteration"]
    return {k: v / seconds if seconds and v is not None else None for k, v in sums.items()}


def log_of(jsonl: str) -> str | None:
    """The text of the .log beside a run's .jsonl, if there is one."""
    log = jsonl.removesuffix(".jsonl") + ".log"
    if os.path.exists(log):
        with open(log) as f:
            return f.read()
    return None


def record(name: str, jsonl: str) -> dict:
    """The record of one run: what it was and its machine from its summary line, rates over the intervals after
    iteration 10 (after 1 in runs of 10 steps or fewer), the last interval's loss, the command from its .log."""
    intervals, summary = read_log(jsonl)
    if not intervals:
        raise RecordError(f"{jsonl}: no log interval (the run stopped before its first; see its .log)")
    last = intervals[-1]["iteration"]
    rates = steady(intervals, WARM if last > WARM else 1)
    gpus, rate = summary.get("gpus"), rates["tokens_per_s"]
    first = (log_of(jsonl) or "").split("\n", 1)[0]
    return {"name": name, **{k: summary.get(k) for k in RUN}, "tokens_per_s": round(rate, 1) if rate else None,
            "tokens_per_s_per_gpu": round(rate / gpus, 1) if rate and gpus else None, "steps": last,
            "loss_at_end": round(intervals[-1]["loss"], 4),
            **{k: round(rates[k], 4) if rates[k] is not None else None for k in MFU},
            **{k: summary.get(k) for k in MACHINE}, "command": first[2:] if first.startswith("$ ") else None}


def runs(arguments: list[str]) -> list[tuple[str, str]]:
    """(name, jsonl) of each argument: NAME=PATH, a .jsonl file, or a folder (its *.jsonl)."""
    found = []
    for argument in arguments:
        name, path = argument.split("=", 1) if "=" in argument and not os.path.exists(argument) else ("", argument)
        if os.path.isdir(path) and not name:
            found += [(os.path.basename(p).removesuffix(".jsonl"), p) for p in sorted(glob.glob(f"{path}/*.jsonl"))]
        elif os.path.isfile(path):
            found.append((name or os.path.basename(path).removesuffix(".jsonl"), path))
        else:
            raise RecordError(f"{argument}: not a .jsonl file, a folder, or NAME= one .jsonl file")
    seen: dict[str, str] = {}
    for name, path in found:
        if name in seen:
            raise RecordError(f"two runs named {name}: {seen[name]} and {path} (give one as NAME=PATH)")
        seen[name] = path
    return found


def baseline_name(name: str) -> str:
    """The run `name` is set against in a table: FP8 against bf16, TE's attention against PyTorch's, in its round."""
    name = re.sub(r"-(tensorwise|delayed|blockwise)((?:-r\d+)?)$", r"-bf16\2", name)
    return re.sub(r"-te((?:-r\d+)?)$", r"-sdpa\1", name)


def table(paths: list[tuple[str, str]], against: str | None = None) -> str:
    """Markdown: a row a run, its ratio to its baseline_name run among them, and with `against` the largest
    relative loss difference from that run's losses over the iterations both logged."""
    def cell(value, form):
        return "-" if value is None else form.format(value)

    rows = {name: (record(name, path), read_log(path)[0], path) for name, path in paths}
    head = ["run", "GPUs", "steps", "tokens/s", "a GPU", "vs base", "MFU causal", "MFU full", "peak GiB", "loss @1",
            "loss at end", "busy", "SM MHz", "recompiles"] + (["max rel. loss diff"] if against else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    reference = {r["iteration"]: r["loss"] for r in read_log(against)[0]} if against else {}
    for name, (r, intervals, path) in rows.items():
        base, ratio, log = rows.get(baseline_name(name), (None,))[0], None, log_of(path)
        if base and base is not r and r["tokens_per_s"] and base["tokens_per_s"]:
            ratio = r["tokens_per_s"] / base["tokens_per_s"]
        cells = [name, cell(r["gpus"], "{}"), str(r["steps"]), cell(r["tokens_per_s"], "{:,.0f}"),
                 cell(r["tokens_per_s_per_gpu"], "{:,.0f}"), cell(ratio, "{:.2f}x"),
                 cell(r["mfu_causal"], "{:.1%}"), cell(r["mfu_full"], "{:.1%}"),
                 cell(max((i.get("max_memory_gib", 0) for i in intervals), default=None), "{:.1f}"),
                 cell(intervals[0]["loss"] if intervals[0]["iteration"] == 1 else None, "{:.4f}"),
                 f"{r['loss_at_end']:.4f}", cell(r["gpu_busy_share"], "{:.2f}"), cell(r["sm_clock_mhz"], "{:.0f}"),
                 cell(log.count("Recompiling function") if log is not None else None, "{}")]
        if against:
            cells.append(cell(max((abs(i["loss"] - reference[i["iteration"]]) / reference[i["iteration"]]
                                   for i in intervals if i["iteration"] in reference), default=None), "{:.3%}"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logs", nargs="+", metavar="DIR_OR_JSONL", help="runs: folders, .jsonl files, NAME=PATH")
    p.add_argument("--out", default=OUT, help="the records (default: bench/results/gpu/records.json)")
    p.add_argument("--append", action="store_true", help="merge into --out by name (a run again replaces its record)")
    p.add_argument("--table", action="store_true", help="print the runs' table instead of recording them")
    p.add_argument("--against", metavar="JSONL", help="with --table: each run's losses against this run's")
    args = p.parse_args(argv)
    try:
        if args.table:
            print(table(runs(args.logs), args.against))
            return 0
        new = [record(name, path) for name, path in runs(args.logs)]
        by_name = {}
        if args.append and os.path.exists(args.out):
            with open(args.out) as f:
                by_name = {r["name"]: r for r in json.load(f)}
    except (RecordError, OSError, json.JSONDecodeError) as e:
        print(f"records.py: {e}", file=sys.stderr)
        return 1
    by_name.update({r["name"]: r for r in new})
    write_json(args.out, list(by_name.values()), depth=1)
    print(f"{len(new)} runs recorded, {len(by_name)} in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
