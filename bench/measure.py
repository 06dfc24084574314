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
from qwen_data.formats.indexed import read_index  # noqa: E402

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


def qwen_data_cli_available(command: str) -> bool:
    """Whether `python3 -m qwen_data.cli COMMAND` exists yet (the CLI is written in parallel)."""
    if not os.path.isfile(os.path.join(REPO_ROOT, "qwen_data", "cli.py")):
        return False
    probe = subprocess.run(qwen_data_command(command, "--help"), cwd=REPO_ROOT, env=python_env(), capture_output=True)
    return probe.returncode == 0


def qwen_data_command(*args) -> list:
    return [sys.executable, "-m", "qwen_data.cli", *map(str, args)]


# --- reading Megatron indexed datasets back (numpy only: megatron-core takes ~8 s to import) ---



@dataclass
class IndexedData:
    tokens: np.ndarray  # memmap of the whole .bin
    sequence_lengths: np.ndarray
    document_indices: np.ndarray

    def document(self, i: int) -> np.ndarray:
        starts = np.concatenate([[0], np.cumsum(self.sequence_lengths, dtype=np.int64)])
        lo, hi = self.document_indices[i], self.document_indices[i + 1]
        return self.tokens[starts[lo] : starts[hi]]


def read_indexed(prefix: str) -> IndexedData:
    index = read_index(prefix + ".idx")
    size = os.path.getsize(prefix + ".bin")
    tokens = np.memmap(prefix + ".bin", dtype=index.dtype, mode="r") if size else np.zeros(0, index.dtype)
    return IndexedData(tokens, np.asarray(index.lengths), np.asarray(index.document_indices))


def compare_indexed(ours: str, theirs: str, label: str = "tokens") -> str | None:
    """None when both prefixes hold the same documents, token for token; else what differs first."""
    a, b = read_indexed(ours), read_indexed(theirs)
    if a.tokens.dtype != b.tokens.dtype:
        return f"{label}: dtype {a.tokens.dtype} vs {b.tokens.dtype}"
    docs_a, docs_b = len(a.document_indices) - 1, len(b.document_indices) - 1
    # Sequence structure may differ legitimately only if documents hold several sequences;
    # both sides here write one sequence per document, so compare per document.
    starts_a = np.concatenate([[0], np.cumsum(a.sequence_lengths, dtype=np.int64)])[a.document_indices]
    starts_b = np.concatenate([[0], np.cumsum(b.sequence_lengths, dtype=np.int64)])[b.document_indices]
    same_bounds = docs_a == docs_b and np.array_equal(starts_a, starts_b)
    if same_bounds and np.array_equal(a.tokens, b.tokens):
        return None
    for i in range(min(docs_a, docs_b)):
        da, db = a.tokens[starts_a[i] : starts_a[i + 1]], b.tokens[starts_b[i] : starts_b[i + 1]]
        if len(da) != len(db) or not np.array_equal(da, db):
            n = min(len(da), len(db))
            first = int(np.argmax(da[:n] != db[:n])) if n and not np.array_equal(da[:n], db[:n]) else n
            return (
                f"{label}: document {i} differs at token {first} (lengths {len(da)} vs {len(db)}): "
                f"{da[max(0, first - 3) : first + 5].tolist()} vs {db[max(0, first - 3) : first + 5].tolist()}"
            )
    return f"{label}: {docs_a} vs {docs_b} documents"


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
