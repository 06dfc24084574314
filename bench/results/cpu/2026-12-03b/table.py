"""runs.jsonl (procs.py's lines) as a table: wall, CPU, the main process, the workers (the N busiest besides main),
the rest (checking processes), when the workers began and ended, and the run's phases."""
import json, sys
n = int(sys.argv[2]) if len(sys.argv) > 2 else 16
for line in open(sys.argv[1]):
    d = json.loads(line)
    procs = sorted(d["procs"].items(), key=lambda kv: kv[1]["first"])
    main = procs[0][1]
    rest = sorted((p for _, p in procs[1:]), key=lambda p: -p["cpu"])
    workers = [p for p in rest if p["cpu"] > 0][:n] if not d["label"].endswith("1") else rest[:1]
    others = [p for p in rest if p not in workers]
    marks = dict((m.split(" ", 1)[1], float(m.split(" ", 1)[0])) for m in (d["marks"] or "marks: ").split(": ", 1)[1].split("; ") if " " in m)
    w = workers or [{"cpu": 0, "first": 0, "last": 0, "rss": 0}]
    print(f"{d['label']:22s} wall {d['wall']:6.2f} cpu {d['cpu']:6.1f} | main {main['cpu']:5.2f} | workers {sum(p['cpu'] for p in w):6.1f} "
          f"(each {min(p['cpu'] for p in w):.2f}-{max(p['cpu'] for p in w):.2f}, began {min(p['first'] for p in w):.2f}-{max(p['first'] for p in w):.2f}, "
          f"ended {min(p['last'] for p in w):.2f}-{max(p['last'] for p in w):.2f}) | others {sum(p['cpu'] for p in others):5.2f} ({len(others)}) | "
          f"rss {sum(p['rss'] for p in d['procs'].values())} | prep {marks.get('< prepare', 0):.2f} first {marks.get('first result', 0):.2f} "
          f"last {marks.get('last result', 0):.2f} end {marks.get('end', 0):.2f} | {str(d['cert'])[:40]}")
