"""Removing 64 files of 133 MB just written (8.5 GB, as a 64-shard Ray run's shards): one thread (shutil.rmtree)
against 8 threads unlinking (kept.remove), alternating, 3 rounds."""
import os, shutil, time
from concurrent.futures import ThreadPoolExecutor
D = "/tmp/rmab"
block = os.urandom(1 << 20)
def make():
    shutil.rmtree(D, ignore_errors=True); os.makedirs(D)
    for k in range(64):
        os.makedirs(f"{D}/{k}")
        with open(f"{D}/{k}/a.bin", "wb") as f:
            for _ in range(133): f.write(block)
        open(f"{D}/{k}/a.idx", "wb").write(block[:4096])
def one(): shutil.rmtree(D)
def threads(n):
    files = [os.path.join(r, x) for r, _, xs in os.walk(D) for x in xs]
    with ThreadPoolExecutor(n) as p: list(p.map(os.unlink, files))
    shutil.rmtree(D)
for rnd in range(3):
    for name, fn in ([("1 thread", one), ("8 threads", lambda: threads(8))] if rnd % 2 == 0 else
                     [("8 threads", lambda: threads(8)), ("1 thread", one)]):
        make(); t = time.monotonic(); fn(); print(f"round {rnd} {name}: {time.monotonic() - t:.2f} s", flush=True)
for name, fn in (("2 threads", lambda: threads(2)), ("4 threads", lambda: threads(4)), ("16 threads", lambda: threads(16))):
    make(); t = time.monotonic(); fn(); print(f"{name}: {time.monotonic() - t:.2f} s", flush=True)
