"""What the thread joining a Ray run's parts waits for while the kernel writes dirty pages back (2-core machine):
removing a 34 MB part, plain and with its pages under writeback; a Head's record of its parts renamed over (as
before 2026-12-03g) or appended to, 200 times while dd writes 6 GB beside it. Run as root (it lowers
vm.dirty_background_bytes to 100 MB for the record's part, as a host past its threshold is, and puts it back):
python3 waits.py"""
import ctypes
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
from qwen_data.formats.outputs import atomic_file  # noqa: E402

D = "/tmp/qwen-data-waits"
os.makedirs(D, exist_ok=True)
libc = ctypes.CDLL("libc.so.6", use_errno=True)
data = os.urandom(1 << 20) * 34
for mode in ("plain", "writeback"):
    took = []
    for k in range(5):
        path = f"{D}/part{k}.bin"
        with open(path, "wb") as f:
            f.write(data)
            if mode == "writeback":  # SYNC_FILE_RANGE_WRITE: its pages' writeback started, not waited for
                libc.sync_file_range(f.fileno(), ctypes.c_longlong(0), ctypes.c_longlong(0), 2)
        t = time.perf_counter()
        os.remove(path)
        took.append(round((time.perf_counter() - t) * 1e3, 1))
    print(f"remove a 34 MB part, {mode}: {took} ms")

def sysctl(name: str, value: str | None = None) -> str:
    path = "/proc/sys/vm/" + name
    if value is not None:
        with open(path, "w") as f:
            f.write(value)
    with open(path) as f:
        return f.read().strip()

before = sysctl("dirty_background_ratio")
sysctl("dirty_background_bytes", "100000000")
try:
    dd = subprocess.Popen(["dd", "if=/dev/zero", f"of={D}/big", "bs=1M", "count=6000"], stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    parts, renamed, appended = [], [], []
    with open(f"{D}/appended.parts", "w") as log:
        for k in range(200):
            parts.append([str(k), 34 << 20])
            t = time.perf_counter()
            with atomic_file(f"{D}/renamed.parts") as f:
                json.dump(parts, f)
            renamed.append(time.perf_counter() - t)
            t = time.perf_counter()
            log.write(json.dumps(parts[-1]) + "\n")
            log.flush()
            appended.append(time.perf_counter() - t)
            time.sleep(0.01)
    dd.wait()
finally:
    sysctl("dirty_background_ratio", before)
for name, took in (("renamed over", renamed), ("appended to", appended)):
    took.sort()
    print(f"a record {name}, 200 times: {sum(took):.3f} s in all, median {took[100] * 1e3:.2f} ms, "
          f"most {took[-1] * 1e3:.1f} ms")
subprocess.run(["rm", "-rf", D])
