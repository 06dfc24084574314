"""Probe: run a command, poll /proc every 10 ms: each descendant's first/last seen and CPU; the tree's busy
cores and the main process's CPU per 100 ms bin."""
import os, subprocess, sys, time
TICK = os.sysconf("SC_CLK_TCK")

def stat(pid):
    with open(f"/proc/{pid}/stat") as f:
        s = f.read()
    r = s.rsplit(")", 1)[1].split()
    return int(r[1]), r[0], (int(r[11]) + int(r[12])) / TICK  # ppid, state, cpu

def stat_t(pid, tid):
    with open(f"/proc/{pid}/task/{tid}/stat") as f:
        s = f.read()
    r = s.rsplit(")", 1)[1].split()
    return s.split("(", 1)[1].rsplit(")", 1)[0], (int(r[11]) + int(r[12])) / TICK


def main():
    t0 = time.monotonic()
    p = subprocess.Popen(sys.argv[1:])
    seen, bins, threads = {}, {}, {}
    while p.poll() is None:
        t = time.monotonic() - t0
        procs = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    procs[int(d)] = stat(int(d))
                except OSError:
                    pass
        tree, frontier = {p.pid}, [p.pid]
        while frontier:
            q = frontier.pop()
            for pid, (pp, _, _) in procs.items():
                if pp == q and pid not in tree:
                    tree.add(pid); frontier.append(pid)
        for pid in tree:
            if pid in procs:
                _, st, cpu = procs[pid]
                a = seen.setdefault(pid, [t, t, 0.0, 0.0])
                a[1], a[2] = t, cpu
        total = sum(a[2] for a in seen.values())
        if int(t * 100) % 5 == 0:
            for pid in tree:
                try:
                    for tid in os.listdir(f"/proc/{pid}/task"):
                        threads[(pid, int(tid))] = stat_t(pid, tid)
                except OSError:
                    pass
        b = int(t * 10)
        main = procs.get(p.pid, (0, 0, 0.0))[2]
        bins[b] = (total, main)
        time.sleep(0.01)
    wall = time.monotonic() - t0
    print(f"TRACE wall {wall:.2f} rc {p.returncode}", file=sys.stderr)
    prev = (0.0, 0.0)
    row = []
    for b in sorted(bins):
        tot, main = bins[b]
        row.append(f"{b/10:.1f}:{(tot-prev[0])*10:.1f}/{(main-prev[1])*10:.1f}")
        prev = (max(tot, prev[0]), main)
    print("TRACE cores/main per 0.1 s:", " ".join(row), file=sys.stderr)
    for pid, (a, z, cpu, _) in sorted(seen.items()):
        print(f"TRACE pid {pid} {a:.2f}-{z:.2f} s cpu {cpu:.2f}", file=sys.stderr)
    for (pid, tid), (name, cpu) in sorted(threads.items()):
        if cpu >= 0.05 and pid != tid:
            print(f"TRACE thread {pid}/{tid} {name} cpu {cpu:.2f}", file=sys.stderr)
    return p.returncode

sys.exit(main())
