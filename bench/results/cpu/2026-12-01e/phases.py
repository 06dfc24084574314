"""Probe: a qwen-data command with its main process's phases timed (seconds from start, to stderr)."""
import sys, time
T0 = time.monotonic()
def mark(what): print(f"PHASE {time.monotonic() - T0:7.3f} {what}", file=sys.stderr, flush=True)
def wrap(owner, name, label):
    f = getattr(owner, name)
    def g(*a, **k):
        mark(label + " begins")
        try:
            return f(*a, **k)
        finally:
            mark(label + " ends")
    setattr(owner, name, g)
from qwen_data.run import pipeline, certifier
from qwen_data.formats import outputs as outs
wrap(pipeline, "checks_for", "checks_for")
wrap(pipeline, "read_back", "read_back")
wrap(pipeline, "_consume", "consume")
wrap(certifier.Certifier, "finish", "certifier.finish")
wrap(outs.AtomicOutputs, "commit", "commit")
orig_results = pipeline._results
def results(*a, **k):
    mark("pool starts")
    first = True
    for r in orig_results(*a, **k):
        if first:
            mark("first result"); first = False
        yield r
    mark("last result")
pipeline._results = results
import atexit; atexit.register(lambda: mark("exit"))
mark("imported")
from qwen_data.launch import main
sys.argv = ["qwen-data"] + sys.argv[1:]
main()
