import time, sys, os, atexit
T0 = time.monotonic()
def log(what): print(f"[{time.monotonic()-T0:6.2f}] {what}", file=sys.stderr, flush=True)
log("python up")
import qwen_data.run.ray as R
import qwen_data.cli as cli
log("qwen_data imported")
def wrap(mod, name):
    f = getattr(mod, name)
    def g(*a, **k):
        log(f"> {name}")
        try: return f(*a, **k)
        finally: log(f"< {name}")
    setattr(mod, name, g)
for n in ["_connect", "_run_shards", "_run_tasks", "_merge", "_check_not_empty", "_newline_counts"]:
    wrap(R, n)
import qwen_data.run.kept as K
wrap(K, "reuse")
wrap(K, "remove")
orig = R._DriverChecks.certificate
def cert(self, *a):
    log("> certificate"); r = orig(self, *a); log("< certificate"); return r
R._DriverChecks.certificate = cert
import shutil as _sh
_rm = _sh.rmtree
def rmtree(path, *a, **k):
    log(f"> rmtree {path}"); r = _rm(path, *a, **k); log("< rmtree"); return r
R.shutil.rmtree = rmtree
_stop = R._stop
def stop(*a):
    log("> ray stop"); _stop(*a); log("< ray stop")
R._stop = stop
atexit.register(lambda: log("atexit"))
if os.environ.get("RM_MODE") == "one":
    K.remove = lambda d: _rm(d, ignore_errors=True)
    wrap(K, "remove")
rc = cli.main(sys.argv[1:])
log(f"main returned {rc}")
sys.exit(rc)
