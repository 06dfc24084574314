"""What each layer of the certificate costs on one corpus: `qwen-data pretrain` (or `sft`) with
--no-certify, with every document spelled but no reference sample, and certified, interleaved, N
rounds; wall and CPU seconds of each (the CPU of the whole process tree).

The middle run is the same command with the reference switched off in its own process (nothing
picked, no checking process): its certificate then says so, and only its time is used.

    python3 bench/certify_layers.py CORPUS.jsonl --workers 16 [--rounds 2] [--json OUT]
    python3 bench/certify_layers.py CHATS.jsonl --sft qwen2.5-instruct.jinja --workers 16
      (sft --template qwen2p5 --pack --seq-length 4096, certified against that official Jinja)

(`bench/certify.py big` makes a 1 GB corpus in which no document repeats.)
"""

from __future__ import annotations

import argparse
import json
import resource
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
COMMANDS = {"no-certify": ["-m", "qwen_data.cli", "{kind}", "--no-certify"],
            "spelled only": ["-c", SPELLING_ONLY, "{kind}"],
            "certified": ["-m", "qwen_data.cli", "{kind}"]}
SFT_ARGS = ["--template", "qwen2p5", "--pack", "--seq-length", "4096"]


def children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--sft", metavar="JINJA", help="run sft, certified against this official Qwen2.5 Jinja")
    args = parser.parse_args()
    kind, extra = ("sft", [*SFT_ARGS, "--reference-template", args.sft]) if args.sft else ("pretrain", [])
    seconds: dict[str, list[float]] = {name: [] for name in COMMANDS}
    cpu: dict[str, list[float]] = {name: [] for name in COMMANDS}
    with tempfile.TemporaryDirectory() as out:
        for r in range(args.rounds):
            for name, command in COMMANDS.items():
                start, used = time.perf_counter(), children_cpu()
                subprocess.run([sys.executable, *[c.format(kind=kind) for c in command], args.corpus, *extra,
                                "-o", f"{out}/p", "--workers", str(args.workers), "--quiet"],
                               check=True, stdout=subprocess.DEVNULL)
                seconds[name].append(round(time.perf_counter() - start, 3))
                cpu[name].append(round(children_cpu() - used, 2))
            print(f"round {r + 1}: " + ", ".join(f"{name} {s[-1]:.2f} s ({cpu[name][-1]:.1f} CPU s)"
                                                 for name, s in seconds.items()), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"corpus": args.corpus, "kind": kind, "workers": args.workers, "seconds": seconds,
                       "cpu_seconds": cpu}, f, indent=1)


if __name__ == "__main__":
    main()
