"""16 local workers against Ray joined to a running cluster at 16 shards, whole commands alternating, every Ray
run through phases.py (its phases and `info` beside OUT); a tree given in TREES runs from /tmp with that tree first on
PYTHONPATH (from the checkout's root, `-m qwen_data` imports the checkout's whatever PYTHONPATH says). The cluster
is started before each Ray run and stopped after it, as bench/cores.py does; the join is in the run's time.

    python3 rayph.py CORPUS ROUNDS OUT.jsonl CASES

CASES: comma-separated, each local-16 or NAME:TREE:PART_MB[:warm] (TREE "." for this checkout, PART_MB 0 for the
default; warm: a driver joins the cluster and runs a task a CPU before the timed run, as a cluster that has run a job
already: the first driver that joins a cluster waits while it starts workers for it).
"""
import json
import os
import shutil
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", ".."))
sys.path.insert(0, os.path.join(here, "..", "..", "..", "bench"))
import measure  # noqa: E402

corpus, rounds, out, names = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4].split(",")
RAY = [sys.executable, "-m", "ray.scripts.scripts"]
WARM = """
import logging, ray
ray.init(address="auto", log_to_driver=False, logging_level=logging.ERROR)
ray.get([ray.remote(num_cpus=1)(lambda: None).remote() for _ in range(int(ray.cluster_resources()["CPU"]))])
"""
for r in range(rounds):
    for case in (names if r % 2 == 0 else names[::-1]):
        shutil.rmtree("/tmp/o", ignore_errors=True)
        name, tree, part_mb, warm = (case.split(":") + ["", "", ""])[:4] if ":" in case else (case, ".", "", "")
        env = measure.python_env(*([os.path.abspath(tree)] if tree != "." else []))
        env.pop("RAY_ADDRESS", None)
        if name == "local-16":
            command = ["-m", "qwen_data", "pretrain", corpus, "-o", "/tmp/o/p", "--workers", "16"]
        else:
            subprocess.run([*RAY, "start", "--head", "--num-cpus", "16", "--include-dashboard=false",
                            "--disable-usage-stats"], env=env, check=True, capture_output=True)
            env["RAY_ADDRESS"] = "auto"
            if warm:
                subprocess.run([sys.executable, "-c", WARM], env=env, check=True, cwd="/tmp")
            command = [os.path.join(here, "phases.py"), part_mb, f"{out}.{name}.{r}.json", "pretrain", corpus,
                       "-o", "/tmp/o/p", "--executor", "ray", "--ray-shards", "16"]
        try:
            m = measure.run([sys.executable, *command], env=env, cwd="/tmp")
        finally:
            if name != "local-16":
                subprocess.run([*RAY, "stop"], env=env, capture_output=True)
        manifest = json.load(open("/tmp/o/p.json"))
        row = {"round": r, "case": name, "wall_s": round(m.wall_s, 3), "cpu_s": round(m.cpu_s, 2),
               "fingerprint": manifest["fingerprint"], "certified": manifest["certificate"]["certified"],
               "lines": [line for line in m.stderr.splitlines() if line.startswith(("ray: ", "phases: ", "driver cpu"))]}
        print(json.dumps(row), flush=True)
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
