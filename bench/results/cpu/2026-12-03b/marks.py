"""`python -m qwen_data` with time marks of the run's phases (stderr, at exit) and env overrides:
QD_CHECKERS (checking processes), QD_CACHES (WORKER_CACHES, MiB)."""
import sys, time, atexit, functools, os
T0 = time.monotonic()
marks = []
def mark(s): marks.append((time.monotonic() - T0, s))
atexit.register(lambda: (mark("atexit last"), print("marks: " + "; ".join(f"{t:.3f} {s}" for t, s in marks), file=sys.stderr), os.environ.get("QD_EXIT") and (sys.stdout.flush(), sys.stderr.flush(), os._exit(0))))
from qwen_data.launch import quiet_blas
quiet_blas(sys.argv[1:])
from qwen_data.run.prestart import prestart
prestart(sys.argv[1:])
mark("prestarted")
from qwen_data import cli
mark("cli imported")
from qwen_data.run import pipeline, certifier
from qwen_data.steps import sft, pretrain
from qwen_data.formats import outputs
def wrap(obj, name, label):
    f = getattr(obj, name)
    @functools.wraps(f)
    def g(*a, **k):
        mark("> " + label)
        try: return f(*a, **k)
        finally: mark("< " + label)
    setattr(obj, name, g)
wrap(pipeline, "_run", "_run"); wrap(sft.ChatSamples, "prepare", "prepare"); wrap(pretrain.Tokenize, "prepare", "prepare")
wrap(pipeline, "checks_for", "checks_for"); wrap(pipeline, "_consume", "consume"); wrap(pipeline, "read_back", "read_back")
wrap(sft.SFTWriter, "close", "close"); wrap(certifier.Certifier, "finish", "certifier.finish")
wrap(outputs.AtomicOutputs, "commit", "commit")
if os.environ.get("QD_FINE"):
    from qwen_data.formats import layouts, indexed, manifest
    from qwen_data.run import journal
    wrap(layouts.LaidOut, "close", "laidout.close"); wrap(indexed.MaskedWriter, "abort", "samples.abort")
    wrap(outputs.AtomicOutputs, "discard", "discard"); wrap(manifest.Manifest, "write", "manifest.write")
    wrap(journal.Journal, "committing", "journal.committing"); wrap(journal.Journal, "remove", "journal.remove")
    wrap(certifier.Certifier, "end", "certifier.end"); wrap(outputs, "finish_commit", "finish_commit")
orig = pipeline._results
def results(*a, **k):
    first = True
    for r in orig(*a, **k):
        if first: mark("first result"); first = False
        yield r
    mark("last result")
pipeline._results = results
if os.environ.get("QD_CHECKERS"):
    pipeline.checkers = lambda step, workers: int(os.environ["QD_CHECKERS"])
if os.environ.get("QD_CACHES"):
    pipeline.WORKER_CACHES = int(os.environ["QD_CACHES"]) << 20
if os.environ.get("QD_SPELLONLY"):  # as bench/certify.py's "spelled only": nothing picked, nothing loaded to check
    from qwen_data.certify import checks, sample
    sample.Sampling.picker = lambda self, path: lambda record: False
    sample.Sampling.picked = lambda self, keys, lines=False: []
    certifier.Certifier.early = staticmethod(lambda *args, **kwargs: [])
    checks.TextChecks.check = checks.ChatChecks.check = lambda self, items: (dict(), None)
sys.argv = ["qwen-data"] + sys.argv[1:]
try:
    code = cli.main()
finally:
    mark("end")
sys.exit(code)
