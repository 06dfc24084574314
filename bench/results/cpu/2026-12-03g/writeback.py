"""Where a Ray run's 16 GB tail comes from: 16 local workers and Ray joined at 16 shards, each writing to the disk
(/tmp) and then to memory (/dev/shm, or a tmpfs at $WRITEBACK_MEMORY), ROUNDS times, with the page cache's dirty
and writeback MB sampled every 0.25 s and the kernel's thresholds beside them. Run from bench/:
python3 results/cpu/2026-12-03g/writeback.py CORPUS ROUNDS OUT.json"""
import json
import os
import shutil
import sys
import threading
import time

sys.path.insert(0, os.getcwd())  # (run from bench/)
import cores  # noqa: E402
import measure  # noqa: E402

corpus, rounds, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]


def meminfo() -> dict:
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {k: int(fields[k].split()[0]) // 1024 for k in ("Dirty", "Writeback", "Shmem", "Cached")}


def thresholds() -> dict:
    with open("/proc/vmstat") as f:
        stats = dict(line.split() for line in f)
    return {k: int(stats[k]) * 4096 >> 20 for k in ("nr_dirty_threshold", "nr_dirty_background_threshold")}


samples, label, stop = [], ["idle"], threading.Event()


def sample() -> None:
    t0 = time.monotonic()
    while not stop.wait(0.25):
        samples.append((round(time.monotonic() - t0, 2), label[0], meminfo()))


threading.Thread(target=sample, daemon=True).start()
runs = []
for where in ("/tmp/wb", os.path.join(os.environ.get("WRITEBACK_MEMORY", "/dev/shm"), "wb")):
    os.makedirs(where, exist_ok=True)
    for k in range(rounds):
        for job in ("local", "ray"):
            label[0] = f"{job}@{where}#{k + 1}"
            prefix = os.path.join(where, job)
            if job == "local":
                m = measure.run(measure.qwen_data_command("pretrain", corpus, "-o", measure.fresh(prefix),
                                                          "--workers", 16, "--quiet"))
            else:
                m = cores.ray(corpus, prefix, 16, joined=True, shards=16)
            during = [s[2] for s in samples if s[1] == label[0]]
            run = {"run": label[0], "wall_s": round(m.wall_s, 2), "cpu_s": round(m.cpu_s, 1),
                   "max_dirty_mb": max((s["Dirty"] for s in during), default=None),
                   "max_writeback_mb": max((s["Writeback"] for s in during), default=None),
                   "ray_log": [line for line in m.stderr.splitlines() if line.startswith("ray: ")]}
            print(json.dumps(run), flush=True)
            runs.append(run)
            label[0] = "cleanup"
            shutil.rmtree(where)
            os.makedirs(where)
            os.sync()
    shutil.rmtree(where)
stop.set()
with open(out, "w") as f:
    json.dump({"corpus": corpus, "thresholds_mb": thresholds(), "runs": runs, "samples": samples}, f)
