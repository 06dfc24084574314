"""The thread joining a Ray run's parts (`merge.Head`, consume) fed parts as a 16-core host's tasks end them (34 MB
each, --rate MB/s) while the kernel writes dirty pages back (the background threshold lowered to 100 MB, as a host
past its own is), this checkout's Head against another's (--old: a merge.py, e.g. `git show aac740c:qwen_data/run/
merge.py > /tmp/merge_aac740c.py`), in turns: how long after the last part was written every part was copied
(and removed). Run as root from the repository: python3 bench/results/cpu/2026-12-03g/heads.py --old FILE"""
import argparse
import importlib.util
import multiprocessing
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", ".."))
from qwen_data.run import merge as new_merge  # noqa: E402

PART = 34 << 20


def old_module(path: str):
    spec = importlib.util.spec_from_file_location("qwen_data.run.merge_old", path)  # (its relative imports resolve)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look it up)
    spec.loader.exec_module(module)
    return module


def writer(folder: str, parts: int, rate: float, ready) -> None:
    data, start = os.urandom(1 << 20) * (PART >> 20), time.monotonic()
    for k in range(parts):
        name = os.path.join(folder, str(k))
        with open(name + ".bin", "wb") as f:
            f.write(data)
        ready.put(name)
        time.sleep(max(0.0, start + (k + 1) * PART / (rate * 1e6) - time.monotonic()))
    ready.put(None)


def one(module, folder: str, parts: int, rate: float) -> float:
    os.makedirs(os.path.join(folder, "joined"))
    head = module.Head(os.path.join(folder, "joined", "0.0.bin"), consume=True)
    ready = multiprocessing.Queue()
    process = multiprocessing.Process(target=writer, args=(folder, parts, rate, ready))
    process.start()
    while (name := ready.get()) is not None:
        head.add(name)
    written = time.monotonic()
    head.close()
    if hasattr(head, "settle"):
        head.settle()
    behind = time.monotonic() - written
    process.join()
    assert os.path.getsize(head.path) == parts * PART
    return behind


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--old", required=True)
    parser.add_argument("--parts", type=int, default=100)
    parser.add_argument("--rate", type=float, default=800, help="MB/s of parts (16 GB in 20 s: 800)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--folder", default="/tmp/qwen-data-heads")
    args = parser.parse_args()
    heads = {"old": old_module(args.old), "new": new_merge}
    with open("/proc/sys/vm/dirty_background_ratio") as f:
        before = f.read().strip()
    with open("/proc/sys/vm/dirty_background_bytes", "w") as f:
        f.write("100000000")
    try:
        for k in range(args.rounds):
            for label, module in heads.items():
                shutil.rmtree(args.folder, ignore_errors=True)
                os.sync()
                behind = one(module, args.folder, args.parts, args.rate)
                print(f"round {k + 1} {label}: every part copied {behind:.2f} s after the last was written", flush=True)
    finally:
        with open("/proc/sys/vm/dirty_background_ratio", "w") as f:
            f.write(before)
        shutil.rmtree(args.folder, ignore_errors=True)


if __name__ == "__main__":
    main()
