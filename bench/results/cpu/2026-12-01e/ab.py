"""A/B: certified SFT with the default checking processes (one per 8 workers) against one per 16, and --no-certify,
interleaved rounds, whole processes (wall, CPU of the tree from wait4's rusage)."""
import json, os, shutil, subprocess, sys, time
corpus, jinja, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
ONE = ("from qwen_data.certify import checks; checks.ChatChecks.workers_per_checker = 16\n"
       "import sys; from qwen_data import launch; sys.argv = ['qwen-data'] + sys.argv[1:]; launch.main()")
NICE = ("import os, sys\nfrom qwen_data.run import prestart, certifier\n"
        "def niced(f):\n    def g(*a, **k):\n        os.nice(10)\n        return f(*a, **k)\n    return g\n"
        "prestart._check_here = niced(prestart._check_here)\ncertifier.check_in_side = niced(certifier.check_in_side)\n"
        "from qwen_data import launch; sys.argv = ['qwen-data'] + sys.argv[1:]; launch.main()")
SCALAR = ("from qwen_data import _native; _native.spelling_path('scalar')\n"
          "import sys; from qwen_data import launch; sys.argv = ['qwen-data'] + sys.argv[1:]; launch.main()")
workers = os.environ.get("WORKERS", "16")
if os.environ.get("JOB") == "pretrain":
    base, ref = ["pretrain", corpus, "--workers", workers, "--quiet"], []
else:
    base = ["sft", corpus, "--template", "qwen2p5", "--pack", "--seq-length", "4096", "--workers", workers, "--quiet"]
    ref = ["--reference-template", jinja]
ways = {"no-certify": ["-m", "qwen_data", *base, "--no-certify"],
        "certified": ["-m", "qwen_data", *base, *ref],
        "one-checker": ["-c", ONE, *base, *ref],
        "niced": ["-c", NICE, *base, *ref],
        "scalar": ["-c", SCALAR, *base, *ref]}
ways = {k: ways[k] for k in os.environ.get("WAYS", ",".join(ways)).split(",")}
out = {k: [] for k in ways}
base_corpus = corpus
for r in range(rounds):
    order = list(ways) if r % 2 == 0 else list(reversed(ways))
    for name in order:
        shutil.rmtree("/tmp/ab", ignore_errors=True)
        t = time.perf_counter()
        p = subprocess.Popen([sys.executable, *ways[name], "-o", "/tmp/ab/c"])
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        m = json.load(open("/tmp/ab/c.json"))
        c = m["certificate"]
        out[name].append({"wall": round(wall, 3), "cpu": round(ru.ru_utime + ru.ru_stime, 2),
                          "certified": c.get("certified"), "checked": c.get("records_checked"), "fp": m["fingerprint"][:16]})
        print(r, name, out[name][-1], flush=True)
import statistics
for k, v in out.items():
    print(k, "median wall %.3f cpu %.2f" % (statistics.median(x["wall"] for x in v), statistics.median(x["cpu"] for x in v)))
