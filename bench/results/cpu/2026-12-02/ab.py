"""A/B of packed SFT at N workers, whole commands alternating (this host's noise falls on both): the tree at
.cpubase (the commit before, its qwen_data on PYTHONPATH) against this checkout, certified and --no-certify.
Prints one JSON line a run: wall, CPU of the tree, peak summed RSS, fingerprint, certified.

    python3 ab.py CORPUS WORKERS ROUNDS TEMPLATE OUT.jsonl [EXTRA ARGS...]
"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench"))
import measure  # noqa: E402

corpus, workers, rounds, template, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
extra = sys.argv[6:]
base = os.path.abspath(".cpubase")
for r in range(rounds):
    trees = [("base", base), ("new", None)] if r % 2 == 0 else [("new", None), ("base", base)]
    for tree, path in trees:
        for args in ([], ["--no-certify"]):
            shutil.rmtree("/tmp/o", ignore_errors=True)
            argv = [sys.executable, "-m", "qwen_data", "sft", corpus, *measure.SFT_ARGS, "--workers", workers,
                    "-o", "/tmp/o/s", "--quiet", "--reference-template", template, *extra, *args]
            m = measure.run(argv, env=measure.python_env(*([path] if path else [])))
            manifest = json.load(open("/tmp/o/s.json"))
            row = {"round": r, "tree": tree, "certify": not args, "wall_s": round(m.wall_s, 3),
                   "cpu_s": round(m.cpu_s, 2),
                   "peak_rss_mib": round(m.peak_rss / 2**20, 1), "fingerprint": manifest["fingerprint"],
                   "certified": manifest["certificate"]["certified"], "corpus": os.path.basename(corpus),
                   "extra": " ".join(extra)}
            print(json.dumps(row), flush=True)
            with open(out, "a") as f:
                f.write(json.dumps(row) + "\n")
