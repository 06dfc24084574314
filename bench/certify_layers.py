"""What each layer of the certificate costs on one corpus: `qwen-data pretrain` with --no-certify,
with every document spelled but no reference sample, and certified, interleaved, N rounds.

The middle run is the same command with the reference switched off in its own process (nothing
picked, no checking process): its certificate then says so, and only its time is used.

    python3 bench/certify_layers.py CORPUS.jsonl --workers 16 [--rounds 2] [--json OUT]

(`bench/certify.py big` makes a 1 GB corpus in which no document repeats.)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

SPELLING_ONLY = """
import sys
from qwen_data.certify import sample
from qwen_data.run import certifier
from qwen_data.cli import main
sample.Sampling.picks = lambda self, chunk, record: False
certifier.Certifier.early = staticmethod(lambda path, count=1: [])
sys.exit(main(sys.argv[1:]))
"""
COMMANDS = {"no-certify": ["-m", "qwen_data.cli", "pretrain", "--no-certify"],
            "spelled only": ["-c", SPELLING_ONLY, "pretrain"],
            "certified": ["-m", "qwen_data.cli", "pretrain"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    seconds: dict[str, list[float]] = {name: [] for name in COMMANDS}
    with tempfile.TemporaryDirectory() as out:
        for r in range(args.rounds):
            for name, command in COMMANDS.items():
                start = time.perf_counter()
                subprocess.run([sys.executable, *command, args.corpus, "-o", f"{out}/p", "--workers",
                                str(args.workers), "--quiet"], check=True, stdout=subprocess.DEVNULL)
                seconds[name].append(round(time.perf_counter() - start, 3))
            print(f"round {r + 1}: " + ", ".join(f"{name} {s[-1]:.2f} s" for name, s in seconds.items()), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"corpus": args.corpus, "workers": args.workers, "seconds": seconds}, f, indent=1)


if __name__ == "__main__":
    main()
