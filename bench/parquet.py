"""Parquet input: `qwen-data pretrain` on a parquet file against the jsonl of the same records.

Both runs tokenize the same documents (the bench text corpus, `corpora.py`), as subprocesses, on
the same worker count, alternating (fastest of --repeat counts); their .bin/.idx must be identical.
The parquet file is written the way corpora ship (snappy, row groups of --row-group rows, the
`text` column beside an `id` and a `url` column the run must not read).

    python3 bench/parquet.py                 # throughput, parquet / jsonl (target >= 90%)
    python3 bench/parquet.py --rss           # peak RSS on 200 MB and 2 GB of parquet text (target: within 10%)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import measure  # noqa: E402
from measure import MB  # noqa: E402

SPEED_TARGET = 0.90
RSS_TARGET = 1.10


def write_parquet(corpus: str, path: str, copies: int, row_group: int) -> int:
    """`copies` times the corpus's records as parquet, streamed; the text bytes written."""
    import orjson
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open(corpus, "rb") as f:
        texts = [orjson.loads(line)["text"] for line in f]
    schema = pa.schema([("id", pa.int64()), ("url", pa.string()), ("text", pa.string())])
    nbytes, n = 0, 0
    with pq.ParquetWriter(path, schema, compression="snappy") as writer:
        for _ in range(copies):
            for start in range(0, len(texts), row_group):
                part = texts[start:start + row_group]
                ids = list(range(n, n + len(part)))
                writer.write_table(pa.table({"id": ids, "url": [f"https://example.org/{i}" for i in ids],
                                             "text": part}, schema=schema), row_group_size=row_group)
                n += len(part)
                nbytes += sum(len(t.encode()) for t in part)
    return nbytes


def run(inputs: str, prefix: str, workers: int) -> measure.Measurement:
    argv = measure.qwen_data_command("pretrain", inputs, "-o", prefix, "--workers", workers, "--quiet")
    return measure.run_measured(argv, env=measure.python_env()).check()


def speed(args, workdir: str) -> int:
    import corpora

    corpus = args.input or corpora.text_corpus()
    parquet = os.path.join(workdir, "text.parquet")
    write_parquet(corpus, parquet, 1, args.row_group)
    best: dict = {}
    for _ in range(args.repeat):
        for name, path in (("jsonl", corpus), ("parquet", parquet)):
            m = run(path, os.path.join(workdir, name), args.workers)
            if name not in best or m.wall_s < best[name].wall_s:
                best[name] = m
    mismatch = measure.compare_indexed(os.path.join(workdir, "parquet"), os.path.join(workdir, "jsonl"))
    size = os.path.getsize(corpus)
    print(f"{corpus}: {size / MB:.1f} MB jsonl, {os.path.getsize(parquet) / MB:.1f} MB parquet; "
          f"{args.workers} workers, fastest of {args.repeat}")
    measure.print_table([[name, f"{m.wall_s:.2f}", f"{m.cpu_s:.2f}", f"{size / MB / m.wall_s:.2f}",
                          measure.fmt_mib(m.peak_rss)] for name, m in best.items()],
                        ["input", "wall s", "cpu s", "MB/s (jsonl bytes)", "peak RSS"])
    share = best["jsonl"].wall_s / best["parquet"].wall_s
    print(f"parquet throughput / jsonl: {share:.0%} (target >= {SPEED_TARGET:.0%}: "
          f"{'met' if share >= SPEED_TARGET else 'NOT met'})")
    print(f"ids: {'identical' if mismatch is None else 'DIFFER: ' + mismatch}")
    return 0 if mismatch is None else 1


def rss(args, workdir: str) -> int:
    import corpora

    corpus = args.input or corpora.text_corpus()
    size = os.path.getsize(corpus)
    rows = []
    for target in (200 * MB, 2000 * MB):
        path = os.path.join(workdir, f"{int(target / MB)}mb.parquet")
        text = write_parquet(corpus, path, max(1, round(target / size)), args.row_group)
        m = run(path, os.path.join(workdir, "out"), args.workers)
        rows.append((text, os.path.getsize(path), m))
        os.remove(path)
    measure.print_table([[f"{t / MB:,.0f}", f"{p / MB:,.0f}", f"{m.wall_s:.1f}", f"{t / MB / m.wall_s:.2f}",
                          measure.fmt_mib(m.peak_rss)] for t, p, m in rows],
                        ["text MB", "parquet MB", "wall s", "MB/s", "peak RSS"])
    growth = rows[1][2].peak_rss / rows[0][2].peak_rss
    print(f"peak RSS 2 GB / 200 MB: {growth:.3f} (target <= {RSS_TARGET:.2f}: "
          f"{'met' if growth <= RSS_TARGET else 'NOT met'})")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--input", help="a jsonl corpus with a text key (default: the bench text corpus)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--row-group", type=int, default=1000, help="rows per parquet row group")
    parser.add_argument("--rss", action="store_true", help="peak RSS on 200 MB and 2 GB instead of speed")
    parser.add_argument("--workdir", help="keep the files here")
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="qwen-data-parquet-")
    os.makedirs(workdir, exist_ok=True)
    try:
        return (rss if args.rss else speed)(args, workdir)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
