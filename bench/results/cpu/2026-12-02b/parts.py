"""`qwen-data ARGS...` with the Ray executor's parts of PART_MB (its PART_BYTES) and the run's `info` (each part's
place in the run: `timeline`) written to INFO.json.

    python3 parts.py PART_MB INFO.json pretrain CORPUS -o PREFIX --executor ray ...
"""
import json
import sys

from qwen_data import cli
from qwen_data.run import ray as executor

part_mb, out, argv = float(sys.argv[1]), sys.argv[2], sys.argv[3:]
executor.PART_BYTES = int(part_mb * (1 << 20))
run_on_ray, info = executor.run_on_ray, {}


def recorded(step, address=None, shards=None, info=None):  # (the CLI imports it from the module as it runs)
    return run_on_ray(step, address=address, shards=shards, info=kept)


kept = info
executor.run_on_ray = recorded
try:
    rc = cli.main(argv)
finally:
    with open(out, "w") as f:
        json.dump(info, f)
sys.exit(rc)
