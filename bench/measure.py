"""What the benchmarks share (bench/README.md): a command run whole with its process tree watched from /proc, ours
against a baseline, tables and JSON results. As a script, where a command's time goes: each thread of its main
process, its children, how many run second by second (--py-spy FILE: also the main process's stacks).

    python3 bench/measure.py -- qwen-data pretrain C.jsonl -o /tmp/o --workers 16 --quiet
"""

import argparse
import filecmp
import glob
import itertools
import json
import multiprocessing
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

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)  # this checkout's qwen_data ahead of an installed one
from qwen_data.formats.outputs import atomic_file  # noqa: E402

PAGE_SIZE, TICK = os.sysconf("SC_PAGE_SIZE"), os.sysconf("SC_CLK_TCK")
MB = 1e6
SFT_ARGS = ["--template", "qwen2p5", "--pack", "--seq-length", "4096"]  # packed SFT, as the benches run it


def build_native(source: str, out: str, *includes: str) -> None:
    """`source` (a `_native.c`) compiled to `out` with the flags the package's build gives it: Python's own
    CFLAGS (-fwrapv among them, which changes what some loops cost) and setup.py's -O3. A baseline built
    with other flags than the tree it is held against measured the flags too: nfc_suspects took 31 M
    instructions without -fwrapv and 45 M with it over the same chunks."""
    import sysconfig

    flags = (sysconfig.get_config_var("CFLAGS") or "").split()
    subprocess.run(["gcc", *flags, "-O3", "-shared", "-fPIC", "-I" + sysconfig.get_paths()["include"],
                    *("-I" + path for path in includes), source, "-o", out], check=True)


@dataclass
class Measurement:
    wall_s: float
    cpu_s: float  # user + system time of the whole tree: steadier than wall time on a busy machine
    peak_rss: int  # bytes, whole process tree: the sum of its processes' RSS (pages a forked worker shares with the
    # main process count in both: with 16 workers, the tokenizer's tables are counted 17 times)
    stdout: str
    stderr: str
    peak_pss: int = 0  # bytes, the sum of its processes' PSS (each shared page divided among those sharing it)


def pss(pid: int) -> int:
    """The proportional set size of `pid` in bytes (0 where it ended, or /proc does not tell)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def stat(path: str) -> tuple[int, str, int, float]:
    """(parent pid, state, RSS bytes, user + system CPU seconds) of a /proc stat file."""
    with open(path, "rb") as f:
        data = f.read()
    fields = data[data.rfind(b")") + 2:].split()  # the command name may hold spaces and parentheses
    return int(fields[1]), fields[0].decode(), int(fields[21]) * PAGE_SIZE, (int(fields[11]) + int(fields[12])) / TICK


def tree(root_pid: int) -> dict[int, tuple[int, str, int, float]]:
    """`stat` of `root_pid` and of each of its descendants, by pid."""
    table, children = {}, {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            table[int(name)] = stat(f"/proc/{name}/stat")
        except OSError:  # the process ended while we looked
            continue
        children.setdefault(table[int(name)][0], []).append(int(name))
    found, todo = {}, [root_pid]
    while todo:
        pid = todo.pop()
        if pid in table:
            found[pid] = table[pid]
        todo.extend(children.get(pid, ()))
    return found


def python_env(*paths: str) -> dict:
    """Environment for child Pythons: `paths` and this checkout's `qwen_data` importable, as the CLI runs it, its
    bytecode cached as an installed package's is (a machine that sets PYTHONDONTWRITEBYTECODE compiled every module
    of a fresh checkout again in every run: ~0.1 s of a run's start on 2 cores, and in each checking process)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join([*paths, REPO_ROOT, *filter(None, [env.get("PYTHONPATH")])])
    return env


def run(argv, *, cwd=None, env=None, interval=0.05) -> Measurement:
    """Run `argv` to completion (RuntimeError unless it succeeds): wall time, CPU of the tree, its peak summed RSS and
    PSS (PSS read every fourth look: reading a process's smaps takes its memory map's lock)."""
    argv = [str(a) for a in argv]
    peak, peak_pss, done = [0], [0], threading.Event()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd or REPO_ROOT, env=env or python_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)

    def sample() -> None:
        for k in itertools.count():
            if done.is_set():
                return
            found = tree(proc.pid)
            peak[0] = max(peak[0], sum(p[2] for p in found.values()))
            if k % 4 == 0:
                peak_pss[0] = max(peak_pss[0], sum(map(pss, found)))
            done.wait(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    if proc.returncode:
        raise RuntimeError(f"command failed ({proc.returncode}): {' '.join(argv)}\n{stderr[-4000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # every descendant waited for: pool workers are
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return Measurement(wall, cpu, peak[0], stdout, stderr, peak_pss[0])


def fresh(prefix: str) -> str:
    """`prefix`, with every file an earlier run wrote under it removed (untimed). A run over an existing dataset
    removes the old one's files as it commits: on a 16-core host that took 0.4-0.8 s for the 2 GB of a packed SFT
    run's outputs (the page cache dropped, the file system's extents freed), the cost of what is replaced, not of the
    run's work, and in the run before it. Each timed run writes where no dataset is, as a first run does."""
    for path in glob.glob(glob.escape(prefix) + "*"):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    return prefix


def qwen_data_command(*args) -> list:
    """The `qwen-data` command as a user runs it (`qwen_data.launch`), from this checkout."""
    return [sys.executable, "-m", "qwen_data", *map(str, args)]


def cpu_model() -> str:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), platform.machine())


def oracle_file(name: str, given: str | None = None) -> str:
    """`given`, or the file `name` of the project's shared oracles ($QWEN_DATA_ORACLES, or shared/ beside the repo)."""
    folders = [os.environ.get("QWEN_DATA_ORACLES"), "/work/shared/oracles",
               *(os.path.join(root, "shared", "oracles") for root in (os.path.dirname(REPO_ROOT), REPO_ROOT))]
    for path in [given] + [os.path.join(f, name) for f in folders if f]:
        if path and os.path.isfile(path):
            return os.path.abspath(path)
    raise SystemExit(f"{name} not found: pass it as a file or set QWEN_DATA_ORACLES to the shared oracles directory")


def print_table(rows: list, headers: list) -> None:
    cells = [[str(c) for c in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            print("  ".join("-" * w for w in widths))


def to_json(value, depth: int, pad: str = "") -> str:
    """JSON text, containers spread one item a line down to `depth` levels, deeper ones each on one line."""
    if depth <= 0 or not isinstance(value, (dict, list)) or not value:
        return json.dumps(value, ensure_ascii=False)
    items = value.items() if isinstance(value, dict) else ((None, v) for v in value)
    lines = [f"{pad} {'' if k is None else json.dumps(k) + ': '}{to_json(v, depth - 1, pad + ' ')}" for k, v in items]
    ends = "{}" if isinstance(value, dict) else "[]"
    return ends[0] + "\n" + ",\n".join(lines) + "\n" + pad + ends[1]


def write_json(path: str, value, depth: int = 2) -> None:
    """`to_json(value, depth)` written whole: a complete file or none."""
    with atomic_file(path) as f:
        f.write(to_json(value, depth) + "\n")


def against_baseline(doc: str, corpus: str, limit: str, unit: str, commands, load, encode, suffixes: list[str]) -> int:
    """pretrain.py, sft.py (bench/README.md): `commands(corpus, ours, baseline, workers)` (name -> argv: ours, then
    the baseline's, which runs `baseline`) on the first `limit` records of `corpora.<corpus>()`, --repeat times
    interleaved, each one's fastest run and ours / baseline. 0 when ours is certified and each dataset (prefix +
    suffix) holds the same bytes as the baseline's."""
    if sys.argv[1:2] == ["baseline"]:  # the baseline program: IN PREFIX WORKERS, then `load`'s arguments
        return baseline(*sys.argv[2:5], load, sys.argv[5:], encode, suffixes)
    import corpora  # not in the baseline program: it imports qwen_data's tokenizer

    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(limit, type=int, dest="limit", metavar="N", help="only the first N records")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each, interleaved: the fastest counts")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="qwen-data-bench-") as work:
        path, ours, base = (os.path.join(work, name) for name in ("corpus.jsonl", "ours", "baseline"))
        with open(getattr(corpora, corpus)(), "rb") as fin, open(path, "wb") as fout:
            records = list(itertools.islice(fin, args.limit))
            fout.writelines(records)
        amount = os.path.getsize(path) / MB if unit == "MB" else len(records)
        print(f"{amount:,.1f} MB" if unit == "MB" else f"{amount} records", f"{args.workers} workers", cpu_model(),
              sep=", ")
        best: dict = {}
        for _ in range(args.repeat):
            for k, (name, argv) in enumerate(commands(path, ours, base, args.workers).items()):
                fresh(base if k else ours)
                m = run(argv)
                best[name] = min(best.get(name, m), m, key=lambda r: r.wall_s)
        figures = {name: [m.wall_s, m.cpu_s, m.peak_rss / 2**20, amount / m.wall_s] for name, m in best.items()}
        rows = [[name, *(f"{v:,.2f}" for v in f)] for name, f in figures.items()]
        mine, theirs = figures.values()
        print_table(rows + [["ours / baseline", *(f"{a / b:.2f}x" for a, b in zip(mine, theirs))]],
                    ["program", "wall s", "cpu s", "peak RSS MiB", f"{unit}/s"])
        with open(ours + ".json", encoding="utf-8") as f:
            certified = json.load(f)["certificate"]["certified"]
        # megatron's format: the same bytes are the same sequences, documents and ids
        same = all(filecmp.cmp(ours + suffix + ext, base + suffix + ext, shallow=False)
                   for suffix in suffixes for ext in (".bin", ".idx"))
        print(f"ours certified: {'yes' if certified else 'NO'}; identical to the baseline's: {'yes' if same else 'NO'}")
        return 0 if certified and same else 1


def baseline(corpus: str, prefix: str, workers: str, load, args: list, encode, suffixes: list[str]) -> None:
    """pretrain.py's and sft.py's baseline program: `load(*args)` (a tokenizer; it returns the vocabulary size) here
    and in each worker of a Pool, `encode` of each line of `corpus` in the pool, and this process writing the arrays
    each returns in order, a dataset a suffix (the ids, then uint8 loss masks)."""
    import numpy as np
    from qwen_data.formats.indexed import IndexedDatasetWriter, token_dtype

    dtypes = [token_dtype(load(*args))] + [np.uint8] * (len(suffixes) - 1)
    # (hashed=False: the usual way hashes nothing; the outputs are compared byte for byte)
    writers = [IndexedDatasetWriter(prefix + s + ".bin", prefix + s + ".idx", d, hashed=False)
               for s, d in zip(suffixes, dtypes)]
    pool = multiprocessing.Pool(int(workers), load, args)
    with open(corpus, encoding="utf-8") as f:
        for arrays in pool.imap(encode, f, chunksize=32):
            for writer, array in zip(writers, arrays):
                writer.add_document(np.array(array, writer.dtype))
    for writer in writers:
        writer.finalize()


def where_time_goes() -> int:
    """The script: the command run, its main process's threads and its descendants sampled every 0.2 s (a thread or
    child that ended keeps its last reading); the first child is a run's certificate process."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--py-spy", metavar="FILE", help="also record the main process's stacks here (raw format)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    start = time.monotonic()
    proc = subprocess.Popen(args.command[1:] if args.command[:1] == ["--"] else args.command)
    spy = args.py_spy and subprocess.Popen(["py-spy", "record", "--idle", "--threads", "--rate", "200", "--format",
                                            "raw", "--nonblocking", "-o", args.py_spy, "--pid", str(proc.pid)],
                                           stdout=subprocess.DEVNULL)
    # thread -> (name, CPU s); child -> CPU s; second -> [(children running, the first child running)]
    threads, children, timeline = {}, {}, {}
    while proc.poll() is None:
        descendants = tree(proc.pid)
        descendants.pop(proc.pid, None)
        children.update({pid: p[3] for pid, p in descendants.items()})
        running = {pid: p[1] == "R" for pid, p in descendants.items()}
        try:
            for tid in os.listdir(f"/proc/{proc.pid}/task"):
                with open(f"/proc/{proc.pid}/task/{tid}/comm", encoding="utf-8", errors="replace") as f:
                    threads[int(tid)] = (f.read().strip(), stat(f"/proc/{proc.pid}/task/{tid}/stat")[3])
        except OSError:  # it ended
            pass
        first = bool(children) and running.get(min(children), False)
        timeline.setdefault(int(time.monotonic() - start), []).append((sum(running.values()), first))
        time.sleep(0.2)
    wall = time.monotonic() - start
    if spy:
        spy.wait(timeout=60)
    out = sys.stderr
    print(f"wall {wall:.2f} s, exit {proc.returncode}", file=out)
    for tid, (name, seconds) in sorted(threads.items(), key=lambda t: -t[1][1]):
        print(f"  main thread {tid:>8} {name:<16} {seconds:7.2f} s  {100 * seconds / wall:5.1f}% of the wall", file=out)
    total = sum(children.values())
    print(f"  children: {len(children)} processes, {total:.2f} s, {total / wall:.2f} cores on average (seen while "
          "sampling)", file=out)
    for child, seconds in sorted(children.items(), key=lambda c: -c[1])[:3]:
        print(f"  child {child:>8} {seconds:7.2f} s", file=out)
    for what, k in (("children running", 0), ("the first child running", 1)):
        print(f"  {what}, each second:", *(f"{sum(s[k] for s in v) / len(v):.1f}" for _, v in sorted(timeline.items())),
              file=out)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(where_time_goes())
