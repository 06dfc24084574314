import psutil, subprocess, sys, time
t0=time.time()
p=subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
root=psutil.Process(p.pid); last={}
while p.poll() is None:
    try:
        procs=[root]+root.children(recursive=True)
    except psutil.NoSuchProcess: break
    for q in procs:
        try:
            c=q.cpu_times(); last[q.pid]=(q.name(), (q.cmdline() or [''])[-1][:30], c.user+c.system)
        except psutil.Error: pass
    time.sleep(0.02)
wall=time.time()-t0
print(f"wall {wall:.2f}")
for pid,(n,c,t) in sorted(last.items()): print(pid, n, c, f"{t:.2f}")
