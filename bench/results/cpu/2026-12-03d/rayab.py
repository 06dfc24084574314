"""One `qwen-data` run with ray.HEAD_PARTS from $QD_HEAD (0: no head start); prints its Ray info as json. It ran
against the head start of README.md, which was not kept: without it, QD_HEAD changes nothing."""
import json, os, sys, time
t0 = time.monotonic()
sys.argv = ["qwen-data"] + sys.argv[1:]
from qwen_data.run import ray as qray
qray.HEAD_PARTS = int(os.environ.get("QD_HEAD", qray.HEAD_PARTS))
orig = qray.run_on_ray
def wrapped(step, address=None, shards=None, info=None):
    info = {} if info is None else info
    try:
        return orig(step, address, shards, info)
    finally:
        tl = info.get("timeline", [])
        keep = {k: v for k, v in info.items() if k not in ("timeline", "shard_seconds", "shard_cpu_seconds", "attempts")}
        if tl:
            keep["first_began"] = min(t[1] for t in tl)
            keep["ray_first_began"] = min(t[1] for t in tl if t[0] >= info.get("head_parts", 0))
            keep["last_ended"] = max(t[2] for t in tl)
            keep["parts_cpu"] = round(sum(info.get("shard_cpu_seconds", [])), 2)
        keep["since_start"] = round(time.monotonic() - t0, 3)
        print("INFO " + json.dumps(keep), file=sys.stderr)
qray.run_on_ray = wrapped
from qwen_data import launch
launch.main()
