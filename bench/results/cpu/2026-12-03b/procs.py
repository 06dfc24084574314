"""Run a command; poll its process tree every 20 ms: each process's CPU, peak RSS, first and last seen; print one line."""
import psutil, sys, time, subprocess, json
label = sys.argv[1]
p = psutil.Popen(sys.argv[2:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
seen = {}
t0 = time.monotonic()
while p.poll() is None:
    try:
        kids = p.children(recursive=True)
    except psutil.Error:
        kids = []
    for c in [p] + kids:
        try:
            ct = c.cpu_times(); rss = c.memory_info().rss >> 20
        except psutil.Error:
            continue
        s = seen.setdefault(c.pid, {"first": round(time.monotonic() - t0, 2)})
        s["cpu"] = round(ct.user + ct.system, 2); s["rss"] = max(s.get("rss", 0), rss); s["last"] = round(time.monotonic() - t0, 2)
    time.sleep(0.02)
wall = time.monotonic() - t0
err = p.stdout.read().decode().strip().splitlines()
marks = [l for l in err if l.startswith("marks:")]
cert = [l for l in err if l.startswith("certified") or l.startswith("not certified")]
out = {"label": label, "wall": round(wall, 2), "rc": p.returncode, "cpu": round(sum(v["cpu"] for v in seen.values()), 2),
       "procs": seen, "marks": marks[-1] if marks else None, "cert": (cert[-1][:100] if cert else err[-3:])}
print(json.dumps(out), flush=True)
print(f"{label}: wall {wall:.2f} cpu {out['cpu']} rc {p.returncode}", file=sys.stderr)
