"""Start-up: wall time of `qwen-data pretrain --quiet one.jsonl -o out/web` on one short document.

Every Ray task and every small job pays this. Measured in one run, each command a subprocess run N
times in turn (median counts): the interpreter with numpy imported (the floor no Python program
using numpy can go under), this checkout with its tokenizer cache warm and with an empty cache
(the first run on a machine), and optionally another checkout (`--against DIR`, e.g. an older
commit unpacked with `git archive`) on the same warm cache. Two more commands bound what start-up
can reach: the floor plus building the Qwen BPE alone, with the backend pretrain uses (gigatoken
from the cached rank file) and with HF `tokenizers` from tokenizer.json; no input, no output.
Bytecode is written and read as an installed package has it (PYTHONDONTWRITEBYTECODE is dropped:
compiling the modules at every start would add ~0.1 s).

    python3 bench/startup.py                      # median of 5
    python3 bench/startup.py --against /tmp/base  # and an older checkout, for before/after
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import measure  # noqa: E402

GOAL_S = 0.3
# The console script `qwen-data` does exactly this.
CLI = "import sys; from qwen_data.cli import main; sys.exit(main())"
BUILD_GIGATOKEN = "import numpy; from qwen_data.text.tokenizer import QwenTokenizer; QwenTokenizer().backend('text')"
BUILD_HF = ("import numpy, os; from tokenizers import Tokenizer; from qwen_data.text.tokenizer import bundled_tokenizer_dir; "
            "Tokenizer.from_file(os.path.join(bundled_tokenizer_dir(), 'tokenizer.json'))")


def command_env(checkout: str, cache: str | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=checkout)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if cache is not None:
        env["XDG_CACHE_HOME"] = cache
    return env


def median_wall(runs: dict, repeat: int, cwd: str) -> dict:
    """name -> median wall seconds of `repeat` runs of (argv, env, before); runs interleave so
    that load from others hits all alike. `before()` runs untimed ahead of each run."""
    walls: dict = {name: [] for name in runs}
    for _ in range(repeat):
        for name, (argv, env, before) in runs.items():
            before()
            start = time.perf_counter()
            measure.run_measured(argv, cwd=cwd, env=env).check()
            walls[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in walls.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5, help="runs of each command; the median counts")
    parser.add_argument("--against", metavar="DIR", help="another checkout of qwen-data to time alike")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="qwen-data-startup-")
    with open(os.path.join(workdir, "one.jsonl"), "w") as f:
        f.write('{"text": "Hello world, a short document."}\n')
    pretrain = [sys.executable, "-c", CLI, "pretrain", "--quiet", "one.jsonl", "-o", "out/web"]
    here = measure.REPO_ROOT
    cold_cache = os.path.join(workdir, "cache")

    def empty_cache() -> None:
        import shutil

        shutil.rmtree(cold_cache, ignore_errors=True)

    runs = {
        "python + numpy (floor)": ([sys.executable, "-c", "import numpy"], command_env(here), lambda: None),
        "pretrain, warm cache": (pretrain, command_env(here), lambda: None),
        "pretrain, empty cache": (pretrain, command_env(here, cold_cache), empty_cache),
        "floor + BPE build (gigatoken)": ([sys.executable, "-c", BUILD_GIGATOKEN], command_env(here), lambda: None),
        "floor + BPE build (HF)": ([sys.executable, "-c", BUILD_HF], command_env(here), lambda: None),
    }
    if args.against:
        runs["--against, warm cache"] = (pretrain, command_env(os.path.abspath(args.against)), lambda: None)
    measure.run_measured(pretrain, cwd=workdir, env=command_env(here)).check()  # fill the warm cache
    if args.against:
        measure.run_measured(pretrain, cwd=workdir, env=command_env(os.path.abspath(args.against))).check()
    medians = median_wall(runs, args.repeat, workdir)
    warm = medians["pretrain, warm cache"]
    measure.print_table([[name, f"{s:.3f}", f"{s / warm:.2f}"] for name, s in medians.items()],
                        ["command", f"median wall s ({args.repeat} runs)", "/ warm"])
    floor = medians["python + numpy (floor)"]
    print(f"warm / floor: {warm / floor:.2f}x; above the floor: {warm - floor:.3f} s; "
          f"goal <= {GOAL_S} s: {'met' if warm <= GOAL_S else 'NOT met'}")
    build = min(medians["floor + BPE build (gigatoken)"], medians["floor + BPE build (HF)"])
    print(f"the floor plus the faster BPE build alone: {build:.3f} s, {'under' if build <= GOAL_S else 'over'} the goal; "
          f"pretrain spends {warm - build:.3f} s beyond it")
    if args.against:
        print(f"--against / this checkout (warm): {medians['--against, warm cache'] / warm:.2f}x faster")


if __name__ == "__main__":
    main()
