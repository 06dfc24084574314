"""The merge's copy of 16 parts into one file (copy_file_range, merge._copy_part) with 1, 2, 4 and 16 threads,
the parts in the page cache: does a thread a part help, or do the threads queue on the output's lock?"""
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from qwen_data.run.merge import _copy_part

d = sys.argv[1]
parts, size = int(sys.argv[2]), int(sys.argv[3]) << 20
os.makedirs(d, exist_ok=True)
rng = np.random.default_rng(0)
block = rng.integers(0, 151643, size // 4, dtype=np.int32).tobytes()
names = []
for k in range(parts):
    names.append(os.path.join(d, f"p{k}"))
    with open(names[-1] + ".bin", "wb") as f:
        f.write(block)
for threads in (1, 2, 4, 16, 1):
    out = os.path.join(d, "out.bin")
    t, c = time.monotonic(), os.times()
    fd = os.open(out, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda k: _copy_part(names[k], fd, k * size, size, False), range(parts)))
    os.close(fd)
    wall, e = time.monotonic() - t, os.times()
    print(f"{threads:2} threads: {parts * size / 1e9:.1f} GB in {wall:.2f} s ({parts * size / 1e9 / wall:.2f} GB/s), "
          f"user {e.user - c.user:.1f} s, sys {e.system - c.system:.1f} s", flush=True)
    os.remove(out)
