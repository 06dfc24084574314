"""Shared benchmark helpers: run a command whole and watch its process tree; read outputs back.

Peak memory is the peak over time of the *sum* of RSS of the command's process and all its
descendants (pool workers included), sampled from /proc. Summing RSS counts pages shared after
fork once per process, so it overstates real use a little; it does so the same way for every
program measured, which is what a ratio needs. Short spikes between samples can be missed.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from qwen_data.formats.indexed import bin_tokens, read_index  # noqa: E402

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MB = 1e6


@dataclass
class Measurement:
    argv: list
    returncode: int
    wall_s: float
    cpu_s: float  # user + system time of the whole tree: steadier than wall time on a busy machine
    peak_rss: int  # bytes, whole process tree
    peak_processes: int
    stdout: str
    stderr: str

    def check(self) -> "Measurement":
        if self.returncode != 0:
            raise RuntimeError(
                f"command failed ({self.returncode}): {' '.join(map(str, self.argv))}\n{self.stderr[-4000:]}"
            )
        return self


def _process_table() -> dict:
    """pid -> (parent pid, rss bytes) for every process visible in /proc."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # the process ended while we looked
            continue
        # The command name may hold spaces and parentheses: fields start after the last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        table[int(name)] = (int(fields[1]), int(fields[21]) * PAGE_SIZE)
    return table


def tree_rss(root_pid: int) -> tuple[int, int]:
    """(summed RSS in bytes, process count) of `root_pid` and all its descendants."""
    table = _process_table()
    children: dict = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    total, count, stack = 0, 0, [root_pid]
    while stack:
        pid = stack.pop()
        if pid in table:
            total += table[pid][1]
            count += 1
        stack.extend(children.get(pid, ()))
    return total, count


def run_measured(argv, *, cwd=None, env=None, interval=0.05) -> Measurement:
    """Run `argv` to completion; wall time and the process tree's peak summed RSS."""
    argv = [str(a) for a in argv]
    peak = [0, 0]
    done = threading.Event()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=cwd or REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )

    def sample() -> None:
        while not done.is_set():
            rss, count = tree_rss(proc.pid)
            peak[0] = max(peak[0], rss)
            peak[1] = max(peak[1], count)
            done.wait(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    # Counts every descendant that was waited for: the pool workers are, by the command itself.
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Measurement(argv, proc.returncode, wall, cpu, peak[0], peak[1], stdout, stderr)


def python_env() -> dict:
    """Environment for child Pythons: this checkout's `qwen_data` importable, as the CLI runs it."""
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def qwen_data_command(*args) -> list:
    return [sys.executable, "-m", "qwen_data.cli", *map(str, args)]


# --- reading outputs back: qwen_data's own reader (megatron-core takes ~8 s to import) ---


def tokens(prefix: str) -> np.ndarray:
    """The .bin of `prefix` as its .idx types it (a memmap)."""
    return bin_tokens(prefix + ".bin", read_index(prefix + ".idx").dtype)


def compare_indexed(ours: str, theirs: str, label: str = "tokens") -> str | None:
    """None when both prefixes hold the same documents, token for token; else what differs first."""
    a, b = read_index(ours + ".idx"), read_index(theirs + ".idx")
    ta, tb = tokens(ours), tokens(theirs)
    if a.dtype != b.dtype:
        return f"{label}: dtype {a.dtype} vs {b.dtype}"
    if a.documents != b.documents:
        return f"{label}: {a.documents} vs {b.documents} documents"
    if not np.array_equal(a.lengths, b.lengths) or not np.array_equal(a.document_indices, b.document_indices):
        first = int(np.argmax(np.asarray(a.lengths) != np.asarray(b.lengths))) if len(a.lengths) == len(b.lengths) else 0
        return f"{label}: sequence lengths differ (first at sequence {first})"
    if not np.array_equal(ta, tb):
        first = int(np.argmax(ta != tb))
        return f"{label}: token {first} differs: {ta[max(0, first - 3):first + 5].tolist()} vs {tb[max(0, first - 3):first + 5].tolist()}"
    return None


# --- figures ---


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


def fmt_mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.0f} MiB"


def print_table(rows: list, headers: list) -> None:
    cells = [[str(c) for c in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            print("  ".join("-" * w for w in widths))
