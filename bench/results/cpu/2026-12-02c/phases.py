"""`qwen-data ARGS...` with the Ray executor's phases marked, in seconds from the process's start (its creation
time: Python's own start included), written with the run's `info` to INFO.json: Ray imported and joined, the
plan, the newline counts sent, the tally made, the tasks sent, each part's begin and end (`info["timeline"]`),
the merge's own steps (each prefix merged, the certificate, the commit), and at each the driver's own CPU seconds
(user, system; its children's once they ended). PART_MB: the parts' size (0: the default).

    python3 phases.py PART_MB INFO.json pretrain CORPUS -o PREFIX --executor ray ...
"""
import json
import resource
import sys
import time

import psutil

T0 = psutil.Process().create_time()
marks: dict[str, float] = {}
cpu: dict[str, list[float]] = {}


def mark(name: str) -> None:
    if name not in marks:
        marks[name] = round(time.time() - T0, 3)
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu[name] = [round(own.ru_utime, 2), round(own.ru_stime, 2), round(children.ru_utime + children.ru_stime, 2)]


mark("python_started")
from qwen_data import cli  # noqa: E402
from qwen_data.formats.outputs import AtomicOutputs  # noqa: E402
from qwen_data.run import merge as merging  # noqa: E402
from qwen_data.run import ray as executor  # noqa: E402

mark("imported")
part_mb, out, argv = float(sys.argv[1]), sys.argv[2], sys.argv[3:]
if part_mb:
    executor.PART_BYTES = int(part_mb * (1 << 20))
info: dict = {}


def wrapped(owner, name: str, before: str, after: str | None = None):
    original = getattr(owner, name)

    def call(*args, **kwargs):
        mark(before)
        try:
            return original(*args, **kwargs)
        finally:
            if after:
                mark(after)
    setattr(owner, name, call)


run_on_ray = executor.run_on_ray
executor.run_on_ray = lambda step, address=None, shards=None, info=None: run_on_ray(step, address, shards, kept)
kept = info
wrapped(executor, "_connect", "connect", "connected")
wrapped(executor, "_newline_counts", "counts", "counts_sent")
wrapped(executor, "_run_tasks", "tasks", "tasks_ended")
wrapped(executor, "_merge", "merge", "merged")
wrapped(merging, "merge", "merge_prefix", "merged_prefix")
wrapped(executor._DriverChecks, "certificate", "certificate", "certificate_made")
wrapped(AtomicOutputs, "commit", "commit", "committed")
ended_init = executor._Ended.__init__


def ended(self, *args, **kwargs):
    ended_init(self, *args, **kwargs)
    marks["sent"] = round(self.sent - T0, 3)


executor._Ended.__init__ = ended
try:
    rc = cli.main(argv)
finally:
    mark("end")
    if info.get("timeline"):
        sent = marks["sent"]
        marks["first_part_began"] = round(sent + min(t[1] for t in info["timeline"]), 3)
        marks["last_part_ended"] = round(sent + max(t[2] for t in info["timeline"]), 3)
    with open(out, "w") as f:
        json.dump({"marks": marks, "cpu": cpu, "info": info}, f)
    print("phases: " + json.dumps(dict(sorted(marks.items(), key=lambda kv: kv[1]))), file=sys.stderr)
    print("driver cpu (user, system, children): " + json.dumps({k: cpu[k] for k in ("connect", "tasks", "tasks_ended",
                                                                                     "end") if k in cpu}),
          file=sys.stderr)
sys.exit(rc)
