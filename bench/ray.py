"""The Ray executor against the local one: `qwen-data pretrain` on the same corpus and the same cores.

Both run whole, as subprocesses: `--executor local --workers N` and `--executor ray` on a local Ray
instance of N CPUs (`RAY_OVERRIDE_RESOURCES`, so a bigger machine does not hand Ray more cores
than the local run gets). Their .bin/.idx must be byte-identical. The Ray run's wall time counts
its shards, the merge and the Ray shutdown, but not the start of the local Ray instance: on a
cluster that is paid once, not per run. The start time is printed on its own, from the CLI's
"ray: started a local instance in X s" line.

    python3 bench/ray.py                     # 2 GB (the scaled cached corpus), 2 workers / 2 CPUs
    python3 bench/ray.py --size-mb 50        # quick check
    python3 bench/ray.py --input FILE --shards 8
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import measure  # noqa: E402
from measure import MB  # noqa: E402

START_LINE = re.compile(r"ray: started a local instance in ([0-9.]+) s")
SHARDS_LINE = re.compile(r"ray: (\d+) shards done in ([0-9.]+) s")


def run_local(corpus: str, prefix: str, workers: int) -> measure.Measurement:
    argv = measure.qwen_data_command("pretrain", corpus, "-o", prefix, "--workers", workers, "--quiet")
    return measure.run_measured(argv, env=measure.python_env()).check()


def run_ray(corpus: str, prefix: str, cpus: int, shards: int | None) -> measure.Measurement:
    extra = ["--ray-shards", shards] if shards else []
    # Not --quiet: the Ray lines say how long the start took. Progress lines go to stderr too.
    argv = measure.qwen_data_command("pretrain", corpus, "-o", prefix, "--executor", "ray", *extra)
    env = measure.python_env() | {"RAY_OVERRIDE_RESOURCES": json.dumps({"CPU": cpus})}
    env.pop("RAY_ADDRESS", None)  # a local instance, always
    return measure.run_measured(argv, env=env).check()


def same_bytes(a: str, b: str) -> bool:
    for suffix in (".bin", ".idx"):
        with open(a + suffix, "rb") as x, open(b + suffix, "rb") as y:
            while True:
                left, right = x.read(1 << 24), y.read(1 << 24)
                if left != right:
                    return False
                if not left:
                    break
    return True


def tokens(prefix: str) -> int:
    with open(prefix + ".json", encoding="utf-8") as f:
        return json.load(f)["tokens"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=2000, help="corpus size (the cached text corpus, scaled)")
    parser.add_argument("--input", help="a jsonl corpus instead of the scaled cached one")
    parser.add_argument("--workers", type=int, default=2, help="local workers, and the Ray instance's CPUs")
    parser.add_argument("--shards", type=int, default=None, help="--ray-shards (default: the executor's choice)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each; the fastest counts")
    parser.add_argument("--workdir", help="keep outputs here (default: a temporary directory, removed)")
    args = parser.parse_args()
    if args.input:
        corpus = args.input
    else:
        import corpora

        corpus = corpora.scaled_text_corpus(args.size_mb * 1_000_000)
    nbytes = os.path.getsize(corpus)
    print(f"corpus: {corpus}  {nbytes / MB:,.1f} MB  local --workers {args.workers}  ray: {args.workers} CPUs, "
          f"{args.shards or 'default'} shards")
    workdir = args.workdir or tempfile.mkdtemp(prefix="qwen-data-bench-ray-")
    os.makedirs(workdir, exist_ok=True)
    local_prefix, ray_prefix = os.path.join(workdir, "local"), os.path.join(workdir, "ray")
    try:
        best_local = best_ray = None
        for _ in range(args.repeat):  # interleaved, so that load from others hits both alike
            m = run_local(corpus, local_prefix, args.workers)
            best_local = m if best_local is None or m.wall_s < best_local.wall_s else best_local
            r = run_ray(corpus, ray_prefix, args.workers, args.shards)
            started = START_LINE.search(r.stderr)
            if not started:
                raise RuntimeError(f"no Ray start line in the output:\n{r.stderr[-2000:]}")
            r.start_s = float(started.group(1))
            r.net_s = r.wall_s - r.start_s
            best_ray = r if best_ray is None or r.net_s < best_ray.net_s else best_ray
        identical = same_bytes(local_prefix, ray_prefix)
        n_tokens = tokens(local_prefix)
        shards = SHARDS_LINE.search(best_ray.stderr)
        rows = [
            ["local", f"{best_local.wall_s:.1f}", f"{best_local.cpu_s:.1f}", f"{nbytes / MB / best_local.wall_s:.2f}",
             f"{n_tokens / 1e6 / best_local.wall_s:.2f}", measure.fmt_mib(best_local.peak_rss)],
            ["ray (start excluded)", f"{best_ray.net_s:.1f}", f"{best_ray.cpu_s:.1f}",
             f"{nbytes / MB / best_ray.net_s:.2f}", f"{n_tokens / 1e6 / best_ray.net_s:.2f}",
             measure.fmt_mib(best_ray.peak_rss)],
        ]
        measure.print_table(rows, ["executor", "wall s", "cpu s", "MB/s", "Mtok/s", "peak RSS"])
        print(f"ray: local instance started in {best_ray.start_s:.1f} s (excluded above); "
              + (f"{shards.group(1)} shards done in {shards.group(2)} s, the rest is merge and shutdown"
                 if shards else "no shard line"))
        print(f"throughput ray / local: {best_local.wall_s / best_ray.net_s:.2f}  "
              f"(with the start: {best_local.wall_s / best_ray.wall_s:.2f})")
        print(f"bytes identical: {'yes' if identical else 'NO'}  ({n_tokens:,} tokens)")
        status = 0 if identical else 1
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(status)


if __name__ == "__main__":
    main()
