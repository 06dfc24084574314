"""Where a command's time goes: each thread of its main process, and its children together
(sampled from /proc every --every seconds; what it prints: bench/README.md).

    python3 bench/threads.py -- qwen-data pretrain C.jsonl -o /tmp/o --workers 16 --quiet
    python3 bench/threads.py --py-spy main.txt -- qwen-data pretrain ...
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def _stat(stat_path: str) -> tuple[str, float]:
    """(state, utime + stime in seconds) of a /proc stat file (fields 3, 14 and 15; the name before
    them may hold spaces)."""
    with open(stat_path, encoding="ascii", errors="replace") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return fields[0], (int(fields[11]) + int(fields[12])) / TICK


def _children(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children", encoding="ascii") as f:
                    kids = [int(k) for k in f.read().split()]
                found += kids
                todo += kids
        except OSError:
            pass
    return found


def sample(pid: int, threads: dict, children: dict, nice: int | None) -> tuple[int, bool]:
    """Update the latest CPU seconds seen of each thread of `pid` and of each of its descendants
    (a process keeps its last reading once it has ended); the number of descendants running now,
    and whether the first one started (a run's side process, started before its workers) runs.
    `nice`: set each new descendant's niceness to it."""
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/comm", encoding="utf-8", errors="replace") as f:
                name = f.read().strip()
            threads[int(tid)] = (name, _stat(f"/proc/{pid}/task/{tid}/stat")[1])
    except OSError:
        return 0, False
    running, first = 0, False
    for child in sorted(_children(pid)):
        try:
            if nice is not None and child not in children:
                os.setpriority(os.PRIO_PROCESS, child, nice)
            state, children[child] = _stat(f"/proc/{child}/stat")
            running += state == "R"
            first = first or (child == min(children) and state == "R")
        except OSError:
            pass
    return running, first


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--every", type=float, default=0.2)
    ap.add_argument("--nice-children", type=int, metavar="N", help="give the command's child processes this niceness")
    ap.add_argument("--py-spy", metavar="FILE", help="also record the main process's stacks here (raw format)")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    start = time.monotonic()
    proc = subprocess.Popen(command)
    spy = None
    if args.py_spy:
        spy = subprocess.Popen(["py-spy", "record", "--idle", "--threads", "--rate", "200", "--format", "raw",
                                "--nonblocking", "-o", args.py_spy, "--pid", str(proc.pid)],
                               stdout=subprocess.DEVNULL)
    threads: dict[int, tuple[str, float]] = {}
    children: dict[int, float] = {}
    timeline: dict[int, list[tuple[int, bool]]] = {}  # second of the run: what each sample saw running
    while proc.poll() is None:
        seen = sample(proc.pid, threads, children, args.nice_children)
        timeline.setdefault(int(time.monotonic() - start), []).append(seen)
        time.sleep(args.every)
    wall = time.monotonic() - start
    if spy is not None:
        spy.wait(timeout=60)
    print(f"wall {wall:.2f} s, exit {proc.returncode}", file=sys.stderr)
    for tid, (name, cpu) in sorted(threads.items(), key=lambda t: -t[1][1]):
        print(f"  main thread {tid:>8} {name:<16} {cpu:7.2f} s  {100 * cpu / wall:5.1f}% of the wall", file=sys.stderr)
    total = sum(children.values())
    print(f"  children: {len(children)} processes, {total:.2f} s, {total / wall:.2f} cores on average "
          "(seen while sampling)", file=sys.stderr)
    for child, cpu in sorted(children.items(), key=lambda c: -c[1])[:3]:
        print(f"  child {child:>8} {cpu:7.2f} s", file=sys.stderr)
    for what, k in (("children running", 0), ("the first child running", 1)):
        line = " ".join(f"{sum(s[k] for s in v) / len(v):.1f}" for _, v in sorted(timeline.items()))
        print(f"  {what}, each second: {line}", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
