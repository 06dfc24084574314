"""A/B: this tree against .cpu18/old (another commit's qwen_data, run from its folder), certified and not,
interleaved rounds, whole processes (wall, CPU of the tree from wait4's rusage)."""
import json, os, shutil, statistics, subprocess, sys, time
corpus, jinja, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
here, old = os.getcwd(), os.path.join(os.getcwd(), ".cpu18", "old")
workers = os.environ.get("WORKERS", "16")
if os.environ.get("JOB", "pretrain") == "pretrain":
    base, ref = ["pretrain", corpus, "--workers", workers, "--quiet"], []
else:
    base = ["sft", corpus, "--template", "qwen2p5", "--pack", "--seq-length", "4096", "--workers", workers, "--quiet"]
    ref = ["--reference-template", jinja]
ways = {"new-no-certify": (here, [*base, "--no-certify"]), "new-certified": (here, [*base, *ref]),
        "old-no-certify": (old, [*base, "--no-certify"]), "old-certified": (old, [*base, *ref])}
ways = {k: ways[k] for k in os.environ.get("WAYS", ",".join(ways)).split(",")}
out = {k: [] for k in ways}
for r in range(rounds):
    for name in (list(ways) if r % 2 == 0 else list(reversed(ways))):
        shutil.rmtree("/tmp/ab", ignore_errors=True)
        cwd, args = ways[name]
        t = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-m", "qwen_data", *args, "-o", "/tmp/ab/c"], cwd=cwd)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        m = json.load(open("/tmp/ab/c.json"))
        out[name].append({"wall": round(wall, 3), "cpu": round(ru.ru_utime + ru.ru_stime, 2),
                          "certified": m["certificate"].get("certified"), "fp": m["fingerprint"][:16]})
        print(r, name, out[name][-1], flush=True)
for k, v in out.items():
    print(k, "median wall %.3f cpu %.2f" % (statistics.median(x["wall"] for x in v), statistics.median(x["cpu"] for x in v)))
