"""A/B of Ray joined to a running cluster against 16 local workers, whole commands alternating (the host's noise
falls on all): this checkout at 16 shards (each taking parts in turn; parts of 32 MB, its default, and 96 MB), the
tree at .cpubase (93a09a7: contiguous shards, one a task) at 64 (its default on 16 CPUs). The cluster is started before each Ray run and stopped
after it (`ray start --head --num-cpus 16`), as bench/cores.py does; the join is in the run's time. Prints one JSON
line a run: wall, CPU of the tree (of the command; Ray's own processes are not its children), fingerprint, and
the run's "ray: ..." lines.

    python3 rayab.py CORPUS ROUNDS OUT.jsonl [CASES]

A case with parts of a given size runs through parts.py, which writes the run's `info` beside OUT.
"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench"))
import measure  # noqa: E402

corpus, rounds, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
base = os.path.abspath(".cpubase")
RAY = [sys.executable, "-m", "ray.scripts.scripts"]
JOINED = ["--executor", "ray", "--ray-shards"]
PARTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "parts.py")
# (name, tree, the parts' MB (parts.py; None: the default), arguments)
cases = [("local-16", None, None, ["--workers", "16"]), ("ray-joined-16", None, None, [*JOINED, "16"]),
         ("ray-joined-16-96mb", None, 96, [*JOINED, "16"]), ("base-ray-joined-64", base, None, [*JOINED, "64"])]
if len(sys.argv) > 4:  # the cases named
    cases = [c for c in cases if c[0] in sys.argv[4].split(",")]
for r in range(rounds):
    for name, tree, part_mb, args in (cases if r % 2 == 0 else cases[::-1]):
        shutil.rmtree("/tmp/o", ignore_errors=True)
        env = measure.python_env(*([tree] if tree else []))
        env.pop("RAY_ADDRESS", None)
        joined = "ray" in args
        if joined:
            subprocess.run([*RAY, "start", "--head", "--num-cpus", "16", "--include-dashboard=false",
                            "--disable-usage-stats"], env=env, check=True, capture_output=True)
            env["RAY_ADDRESS"] = "auto"
        try:
            # (from /tmp: run from the checkout, `-m qwen_data` would import the checkout's whatever PYTHONPATH says)
            command = ["-m", "qwen_data"] if part_mb is None else [PARTS, str(part_mb), f"{out}.{name}.{r}.json"]
            m = measure.run([sys.executable, *command, "pretrain", corpus, "-o", "/tmp/o/p", *args], env=env,
                            cwd="/tmp")
        finally:
            if joined:
                subprocess.run([*RAY, "stop"], env=env, capture_output=True)
        manifest = json.load(open("/tmp/o/p.json"))
        row = {"round": r, "case": name, "wall_s": round(m.wall_s, 3), "cpu_s": round(m.cpu_s, 2),
               "peak_rss_mib": round(m.peak_rss / 2**20, 1), "fingerprint": manifest["fingerprint"],
               "certified": manifest["certificate"]["certified"],
               "ray": [line for line in m.stderr.splitlines() if line.startswith("ray: ")]}
        print(json.dumps(row), flush=True)
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
