"""Removing 16 files of 530 MB just written (a Ray run's shards after its merge), by 1, 4 and 16 threads: does
freeing their pages from the page cache go faster in parallel?"""
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

block = np.random.default_rng(0).integers(0, 151643, 530 << 18, dtype=np.int32).tobytes()


def write(path: str) -> None:
    with open(path, "wb") as f:
        f.write(block)


for threads in (1, 4, 16, 1, 4):
    d = "/tmp/unlink"
    os.makedirs(d, exist_ok=True)
    paths = [f"{d}/{k}.bin" for k in range(16)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(write, paths))
    time.sleep(0.5)
    t = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(os.remove, paths))
    shutil.rmtree(d)
    print(f"{threads:2} threads: 8.9 GB just written removed in {time.monotonic() - t:.2f} s", flush=True)
