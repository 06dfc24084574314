"""`qwen-data verify` speed and memory on one core (in this process, pinned, warm; target >= 200 MB/s) against a
plain sequential read of the same files; with --data-check, the train stage's check of its data
(`qwen_data.formats.integrity`) on one thread and on all cores. The prefixes: `build` (bench/README.md).

    python3 bench/verify.py --text-mb 100 --repeat 1 --workdir /tmp/qd-verify [--data-check]
"""

import argparse
import os
import sys
import tempfile
import time

import measure  # first: this checkout's qwen_data
import corpora
from qwen_data.formats.indexed import MaskedWriter
from qwen_data.tools.verify import verify


def files(prefix: str) -> list[str]:
    return [path for path in MaskedWriter.files(prefix) if os.path.exists(path)]


def build(workdir: str, text_mb: int, chats_mb: int) -> list[str]:
    """A pretrain prefix of the bench text and a packed SFT prefix of its chats, repeated to these sizes (made once
    in `workdir`), by `qwen-data` itself."""
    made = []
    sft = ["sft", corpora.scaled_sft_corpus("chat", chats_mb * 1_000_000), *measure.SFT_ARGS]
    for name, argv in ((f"pretrain-{text_mb}MB", ["pretrain", corpora.scaled_text_corpus(text_mb * 1_000_000)]),
                       (f"sft-{chats_mb}MB", sft)):
        made.append(os.path.join(workdir, name))
        if not os.path.exists(made[-1] + ".json"):
            m = measure.run(measure.qwen_data_command(*argv, "-o", made[-1], "--no-certify", "--quiet"))
            print(f"built {made[-1]} in {m.wall_s:.1f} s")
    return made


def rss(field: str) -> float:
    """VmRSS (now) or VmHWM (the peak since `timed` set it back) of this process, MB."""
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) * 1024 / measure.MB for line in f if line.startswith(field + ":"))


def timed(work, repeat: int) -> tuple[float, float, float]:
    """(fastest seconds of `repeat` calls of `work`, this process's RSS before and its peak during them, MB)."""
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # the peak RSS set back to the RSS now
    before, seconds = rss("VmRSS"), []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        seconds.append(time.perf_counter() - start)
    return min(seconds), before, rss("VmHWM")


def read(*prefixes: str) -> None:
    """Every file of the prefixes, read in order (and so in the page cache)."""
    buf = bytearray(1 << 24)
    for path in (path for prefix in prefixes for path in files(prefix)):
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def data_check(prefixes: list[str]) -> None:
    from qwen_data.formats.integrity import check_prefixes
    from qwen_data.formats.manifest import Manifest

    read(*prefixes)  # the page cache warm
    sources = [(p, Manifest.read(p)) for p in prefixes]
    for threads in sorted({1, os.cpu_count() or 1}):
        results = []
        best = timed(lambda: results.append(check_prefixes(sources, threads)), 3)[0]
        if any(r.problem for r in results[-1]):
            raise SystemExit("\n".join(r.problem for r in results[-1] if r.problem))
        size = sum(r.bytes for r in results[-1])
        print(f"{len(prefixes)} prefixes, {size / 1e9:.2f} GB, {threads} thread{'s' * (threads > 1)}: "
              f"{best:.2f} s = {size / best / 1e9:.2f} GB/s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--text-mb", type=int, default=400, help="the bench text for the pretrain prefix (MB)")
    parser.add_argument("--chats-mb", type=int, default=160, help="the bench chats for the packed SFT prefix (MB)")
    parser.add_argument("--repeat", type=int, default=3, help="fastest of N runs counts")
    parser.add_argument("--workdir", default=None, help="keep the prefixes here and reuse them")
    parser.add_argument("--data-check", action="store_true", help="the train stage's check instead of verify")
    args = parser.parse_args()
    workdir = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="qwen-data-bench-verify-"))
    os.makedirs(workdir, exist_ok=True)
    prefixes = build(workdir, args.text_mb, args.chats_mb)
    if args.data_check:
        return data_check(prefixes)
    cpu = max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})  # this thread, and the threads verify starts, on one core
    failed = False
    for kind, prefix in zip(("pretrain", "sft"), prefixes):
        size = sum(map(os.path.getsize, files(prefix))) / measure.MB
        problems = verify(prefix)  # and warm: the files in the page cache
        if problems:
            raise SystemExit("verify found problems:\n" + "\n".join(problems))
        read_s = timed(lambda: read(prefix), args.repeat)[0]
        verify_s, before, peak = timed(lambda: verify(prefix), args.repeat)
        failed |= size / verify_s < 200
        print(f"{kind:<8} {size:,.0f} MB on core {cpu}: verify {verify_s:.2f} s = {size / verify_s:,.0f} MB/s, "
              f"peak RSS {peak:,.0f} MB ({before:,.0f} MB before) | sequential read {read_s:.2f} s = "
              f"{size / read_s:,.0f} MB/s | verify / read = {read_s / verify_s:.2f}"
              f"{'' if size / verify_s >= 200 else '  BELOW the 200 MB/s target'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
