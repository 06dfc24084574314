"""How the data side scales with the cores: pretrain and SFT at 1, 2, 4 ... N workers, one run (jobs, raw gigatoken
alone and in N processes at once, --unique: bench/README.md and docs/performance.md). Writes --out.

    python3 bench/cores.py --workers 1,16 --jobs pretrain --corpus-mb 200
    python3 bench/cores.py --megatron /path/Megatron-LM --megatron-mb 300 --ray --rss-mb 1000,4000
    python3 bench/cores.py --unique --text FILE --corpus-mb 2000 --workers 1,16 --jobs pretrain
    python3 bench/cores.py --unique --no-repeated --corpus-mb 8000 --workers 16 --jobs pretrain --ray \
        --ray-joined-only --ray-shards 16 --ray-rounds 3
    python3 bench/cores.py --unique --corpus-mb 8000 --sft-mb 2000 --workers 1,16 --rounds 3 ...   # medians of 3
"""

import argparse
import contextlib
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import unicodedata

import measure  # first: this checkout's qwen_data
import corpora
from measure import MB, SFT_ARGS
from qwen_data.text.tokenizer import bundled_tokenizer_dir

RAW_BYTES = 64 * MB
TEMPLATE = "qwen2.5-instruct.jinja"


def host() -> dict:
    """The CPU, the cores this process may use, and whether two of them are threads of one physical core (which
    decides what N workers can give)."""
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        processors = [[line.split(":", 1) for line in p.splitlines() if ":" in line] for p in f.read().split("\n\n")]
    processors = [{k.strip(): v.strip() for k, v in p} for p in processors if p]
    with open("/proc/sys/kernel/random/boot_id", encoding="utf-8") as f:  # one host's one boot: `--continue`
        boot = f.read().strip()
    info = {"cpu_model": measure.cpu_model(), "cores": len(os.sched_getaffinity(0)), "boot_id": boot}
    physical = {(p.get("physical id"), p.get("core id")) for p in processors}
    if (None, None) not in physical:
        info.update(sockets=len({socket for socket, _ in physical}), physical_cores=len(physical),
                    threads_per_core=round(len(processors) / len(physical), 2))
    return info


def _raw_texts(corpus: str, start: int = 0) -> tuple[list[str], int, object]:
    """(texts, bytes, a fresh tokenizer): RAW_BYTES of the corpus from the line after `start`, NFC."""
    import gigatoken

    texts, size = [], 0
    with open(corpus, "rb") as f:
        if start:
            f.seek(start)
            f.readline()
        for line in f:
            texts.append(unicodedata.normalize("NFC", json.loads(line)["text"]))
            size += len(texts[-1].encode("utf-8"))
            if size >= RAW_BYTES:
                break
    tok = gigatoken.Tokenizer(os.path.join(bundled_tokenizer_dir(), "tokenizer.json"))
    tok.encode_batch(["warm up, once"], parallel=False)
    return texts, size, tok


def raw_mb_per_s(corpus: str, n: int = 1) -> tuple[float, float]:
    """`n` processes each running gigatoken on its own RAW_BYTES of the corpus (spread over it; NFC untimed), started
    together, fresh and then on a second pass (its word cache warm, as a worker meets a repeated corpus a second
    time): their bytes over the slowest one's time (one core's rate; with n, the host's ceiling for n workers)."""
    context = multiprocessing.get_context("fork")
    ready, again = context.Barrier(n + 1, timeout=600), context.Barrier(n + 1, timeout=600)
    results = context.SimpleQueue()
    step = int(max(0, os.path.getsize(corpus) - 2 * RAW_BYTES) // max(1, n - 1))

    def one(k: int) -> None:
        try:
            texts, size, tok = _raw_texts(corpus, k * step)
        except BaseException:
            ready.abort()  # the others, and the parent, stop waiting
            again.abort()
            raise
        seconds = []
        for barrier in (ready, again):
            barrier.wait()
            begun = time.perf_counter()
            tok.encode_batch(texts, parallel=False)
            seconds.append(time.perf_counter() - begun)
        results.put((size, *seconds))

    processes = [context.Process(target=one, args=(k,)) for k in range(n)]
    for p in processes:
        p.start()
    try:
        ready.wait()
        again.wait()
        done = [results.get() for _ in processes]
    finally:
        for p in processes:
            p.join()
    total = sum(size for size, _, _ in done) / MB
    return total / max(cold for _, cold, _ in done), total / max(warm for _, _, warm in done)


def best_raw(corpus: str, n: int = 1) -> tuple[float, float]:
    """`raw_mb_per_s`, the better of two tries: a fresh GPU host's memory grows as it is first used, which slowed
    the first try of one host by a third."""
    return max(raw_mb_per_s(corpus, n), raw_mb_per_s(corpus, n))


def record(job: str, workers: int, corpus: str, m: measure.Measurement, prefix: str | None = None) -> dict:
    size = os.path.getsize(corpus)
    out = {"job": job, "workers": workers, "corpus_mb": round(size / MB, 1), "wall_s": round(m.wall_s, 2),
           "mb_per_s": round(size / MB / m.wall_s, 1), "cpu_s": round(m.cpu_s, 1),
           "peak_rss_mib": round(m.peak_rss / 2**20), "peak_pss_mib": round(m.peak_pss / 2**20)}
    if prefix is not None:
        out["sha256"] = {ext: corpora.file_sha256(prefix + ext) for ext in (".bin", ".idx")}
        with open(prefix + ".json", encoding="utf-8") as f:
            certificate = json.load(f)["certificate"]
        out["certified"], out["fingerprint"] = certificate.get("certified", False), certificate.get("fingerprint")
    print(f"{job:11} {workers:3} workers  {out['corpus_mb']:8.1f} MB  {out['wall_s']:7.2f} s  "
          f"{out['mb_per_s']:7.1f} MB/s  cpu {out['cpu_s']:7.1f} s  rss {out['peak_rss_mib']:6} MiB  "
          f"pss {out['peak_pss_mib']:6} MiB", flush=True)
    return out


def megatron(checkout: str, corpus: str, prefix: str, workers: int) -> measure.Measurement:
    """Megatron-LM's preprocess_data.py as its README runs it for a HF tokenizer."""
    argv = [sys.executable, os.path.join(checkout, "tools", "preprocess_data.py"), "--input", corpus,
            "--output-prefix", measure.fresh(prefix), "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
            bundled_tokenizer_dir(), "--workers", workers, "--append-eod", "--json-keys", "text"]
    return measure.run(argv, env=measure.python_env(checkout))


def ray(corpus: str, prefix: str, workers: int, joined: bool, shards: int | None = None) -> measure.Measurement:
    """`--executor ray` on a cluster of `workers` CPUs, in `shards` shards (default `workers`; 0: as many as the
    executor chooses): Ray started by the run, or (`joined`) a cluster started beforehand (`ray start --head`, as a
    multi-node cluster is). Not --quiet: its "ray: ..." lines (start or join, the shards' time) go into the record."""
    shards = workers if shards is None else shards
    argv = measure.qwen_data_command("pretrain", corpus, "-o", measure.fresh(prefix), "--executor", "ray",
                                     *(["--ray-shards", shards] if shards else []))
    env = ray_env()
    if not joined:
        return measure.run(argv, env=env | {"RAY_OVERRIDE_RESOURCES": json.dumps({"CPU": workers})})
    with cluster(workers, env):
        return measure.run(argv, env=env | {"RAY_ADDRESS": "auto"})


# Ray's own share of a joined run, which no executor can leave out: a driver that imports Ray, joins a cluster
# started just before (as `ray` joins one), holds one task of one CPU per shard at once (each waits HOLD_S, so that
# each takes a worker process of its own, as a shard does), and exits. Its wall less HOLD_S, added to the local
# workers' wall beside it, is what a Ray run takes whose tasks work as the local workers do and whose share of Ray
# overlaps none of that work (`ray_over_least`: how far a Ray run is from it).
HOLD_S = 0.2
RAY_FLOOR = f"""
import logging, sys, time
import ray
ray.init(log_to_driver=False, logging_level=logging.ERROR)
hold = ray.remote(num_cpus=1)(lambda: time.sleep({HOLD_S}))
ray.get([hold.remote() for _ in range(int(sys.argv[1]))])
"""


def ray_floor(workers: int, shards: int) -> float:
    """Seconds of RAY_FLOOR (less its tasks' wait) on a fresh cluster of `workers` CPUs, with `shards` tasks."""
    env = ray_env()
    with cluster(workers, env):
        m = measure.run([sys.executable, "-c", RAY_FLOOR, shards or workers], env=env | {"RAY_ADDRESS": "auto"})
    return round(m.wall_s - HOLD_S, 3)


def ray_env() -> dict:
    """This checkout's environment without a RAY_ADDRESS of the caller's: each run says which Ray it takes."""
    env = measure.python_env()
    env.pop("RAY_ADDRESS", None)
    return env


@contextlib.contextmanager
def cluster(workers: int, env: dict):
    """A Ray cluster of `workers` CPUs on this host (`ray start --head`) while the block runs, stopped after
    (`ray stop` ends every Ray on the host: the bench runs alone there)."""
    cli = [sys.executable, "-m", "ray.scripts.scripts"]
    subprocess.run([*cli, "start", "--head", "--num-cpus", str(workers), "--include-dashboard=false",
                    "--disable-usage-stats"], env=env, check=True, capture_output=True)
    try:
        yield
    finally:
        subprocess.run([*cli, "stop"], env=env, capture_output=True)


def efficiencies(runs: list[dict], raw: float, raw_parallel: list[dict]) -> None:
    """Adds, to each run of ours, its rate against N x its own 1-worker rate, against N x raw, and against the
    host's ceiling for N (`vs_ceiling`: N raw processes at once, where they were measured)."""
    single = {r["job"]: r["mb_per_s"] for r in runs if r["workers"] == 1}
    ceiling = {p["processes"]: p["mb_per_s"] for p in raw_parallel}
    for r in runs:
        if r["job"] in single:
            r["vs_own_1_worker"] = round(r["mb_per_s"] / (r["workers"] * single[r["job"]]), 3)
            r["speedup"] = round(r["mb_per_s"] / single[r["job"]], 2)
        if r["job"] in ("pretrain", "pretrain-beside-ray", "ray", "ray-joined", "megatron"):
            r["vs_raw"] = round(r["mb_per_s"] / (r["workers"] * raw), 3)
            if r["workers"] in ceiling:
                r["vs_ceiling"] = round(r["mb_per_s"] / ceiling[r["workers"]], 3)


MEDIANS = ("wall_s", "mb_per_s", "speedup", "vs_ceiling", "vs_adjacent_ceiling", "local_over_ray", "ray_floor_s",
           "local_over_ray_least", "ray_over_least", "peak_rss_mib", "peak_pss_mib")


def summary(runs: list[dict]) -> list[dict]:
    """Per job and worker count, in the order of their first run: how many runs, and the median of each of MEDIANS they
    hold (with the least and the most: one host's runs vary), and whether all were certified and wrote one
    fingerprint."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        if not r["job"].startswith("warm-up"):
            groups.setdefault((r["job"], r["workers"]), []).append(r)
    out = []
    for (job, workers), group in groups.items():
        line = {"job": job, "workers": workers, "runs": len(group)}
        for name in MEDIANS:
            values = [r[name] for r in group if name in r]
            if values:
                line[name] = round(statistics.median(values), 3)
                if len(values) > 1:
                    line[name + "_range"] = [min(values), max(values)]
        line["certified"] = all(r.get("certified") for r in group)
        line["fingerprints"] = sorted({r["fingerprint"] for r in group if r.get("fingerprint")})
        out.append(line)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", help="comma-separated (default: 1, 2, 4 ... up to the cores)")
    parser.add_argument("--jobs", default="pretrain,sft-chat,sft-alpaca")
    parser.add_argument("--corpus-mb", type=int, default=1000)
    parser.add_argument("--sft-mb", type=int, default=200)
    parser.add_argument("--rss-mb", default="", help="also pretrain at --compare-at workers on these sizes "
                                                     "(comma-separated): whether memory stays flat in the corpus size")
    parser.add_argument("--megatron", help="a Megatron-LM checkout: its preprocess_data.py at --compare-at workers")
    parser.add_argument("--megatron-mb", type=int, default=300, help="the corpus size Megatron's script runs on")
    parser.add_argument("--ray", action="store_true", help="also --executor ray at --compare-at workers")
    parser.add_argument("--ray-shards", default="", help="the shard counts of the Ray runs, comma-separated (default "
                        "--compare-at; 0: the executor's own count)")
    parser.add_argument("--ray-joined-only", action="store_true", help="only Ray joined to a cluster started before")
    parser.add_argument("--ray-rounds", type=int, default=1, help="Ray runs of each kind, each right after a run of "
                        "16 local workers (--compare-at) on the same corpus: a pair's local / Ray is its record's "
                        "`local_over_ray` (one host's runs of a command vary by more than the gap measured)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each job at each count above 1 worker, back to "
                        "back: `summary` gives their median (a 5-7 s run of 16 workers varies by 10-20%% from run to "
                        "run on one host, a 1-worker run of a minute by far less)")
    parser.add_argument("--adjacent-ceiling", action="store_true", help="also measure the 16 (32 ...) process "
                        "ceiling right before each pretrain run at that count on the --unique corpus (the run's "
                        "`vs_adjacent_ceiling`): one host's ceiling moved by a fifth between two calls minutes apart")
    parser.add_argument("--compare-at", type=int, help="the workers Megatron's script and Ray run with, ours beside "
                                                       "them (default 16 where --workers holds it, else the most)")
    parser.add_argument("--unique", action="store_true", help="pretrain and SFT on corpora in which no record repeats")
    parser.add_argument("--no-repeated", action="store_true", help="with --unique, no run on the repeated corpus "
                        "beside it (a corpus as large again on the disk)")
    parser.add_argument("--text", help="the bench text corpus (default: bench/corpora.py's cache)")
    parser.add_argument("--chats", help="the bench chat corpus (default: bench/corpora.py's cache)")
    parser.add_argument("--reference-template", metavar="FILE", help="the official qwen2.5-instruct.jinja, which "
                        "certifies the SFT jobs (default: the shared oracles'; none found: they run uncertified)")
    parser.add_argument("--continue", dest="more", action="store_true", help="add to --out, which this host "
                        "wrote since it booted: its ceilings and runs kept, the runs it holds not made again (a "
                        "device call's time limit cut short a run of every job on GBs)")
    parser.add_argument("--out", default=os.path.join(measure.REPO_ROOT, "bench", "results", "cpu", "cores.json"))
    args = parser.parse_args()
    info = host()
    counts = [int(n) for n in args.workers.split(",")] if args.workers else \
        [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= info["cores"]]
    top = max(counts)
    at = args.compare_at or (16 if 16 in counts else top)
    repeated = text = (None if args.unique and args.no_repeated else
                       corpora.scaled_text_corpus(args.corpus_mb * 1_000_000, args.text))
    how = {"repeats": True, "how": "the bench text corpus (40 MB) repeated to size"}
    if args.unique:
        text = corpora.unique_corpus(f"text-unique-{args.corpus_mb}MB.jsonl", args.text or corpora.text_corpus(),
                                     args.corpus_mb * 1_000_000)
        with open(text + ".json", encoding="utf-8") as f:
            how = {"repeats": False, "how": corpora.UNIQUE, "made": json.load(f)}
    corpus_info = {"path": text, "bytes": os.path.getsize(text), **how}
    before = earlier(args.out, info) if args.more else {}
    raw, raw_warm = (before["raw_mb_per_s"], before["raw_warm_mb_per_s"]) if before else best_raw(text)
    print(f"host: {info['cpu_model']}, {info['cores']} cores; raw gigatoken on one core: {raw:.1f} MB/s "
          f"({raw_warm:.1f} MB/s on a second pass)", flush=True)
    raw_parallel = before.get("raw_parallel", [])
    for n in sorted(({n for n in counts if n >= 16} | {top}) - {p["processes"] for p in raw_parallel}):
        cold, warm = best_raw(text, n)
        raw_parallel.append({"processes": n, "mb_per_s": round(cold, 1), "vs_raw": round(cold / raw, 2),
                             "warm_mb_per_s": round(warm, 1), "warm_vs_raw_warm": round(warm / raw_warm, 2)})
        print(f"raw gigatoken in {n} processes at once: {cold:.1f} MB/s ({cold / raw:.1f}x one), "
              f"{warm:.1f} MB/s on a second pass ({warm / raw_warm:.1f}x one)", flush=True)
    ceilings = {p["processes"] for p in raw_parallel}
    jobs = args.jobs.split(",")
    # --unique: SFT's records never repeat either (one worker meets a repeated corpus's words cold once, each of
    # 16 workers does: its scaling figure flatters no one but one worker)
    sft_corpus = corpora.unique_sft_corpus if args.unique else corpora.scaled_sft_corpus
    corpus_of = {"pretrain": text, **{job: sft_corpus(job[4:], args.sft_mb * 1_000_000, args.chats)
                                      for job in jobs if job in ("sft-chat", "sft-alpaca")}}
    sft_info = {job: {"path": path, "bytes": os.path.getsize(path), "repeats": not args.unique,
                      "how": corpora.UNIQUE if args.unique else "the bench chats (or their alpaca records) "
                      "repeated to size"} for job, path in corpus_of.items() if job != "pretrain"}
    corpus_info["sft"] = same_corpora(before.get("corpus"), corpus_info, sft_info) if before else sft_info
    # The corpora just made are on disk before any run is timed, so that no run shares the host with the
    # kernel writing GBs of them back.
    os.sync()
    runs: list[dict] = before.get("runs", [])
    done = {(r["job"], r["workers"], r.get("round", 1)) for r in runs}
    work = tempfile.mkdtemp(prefix="cores-")

    def add(run: dict) -> None:  # written after every run: a run cut short keeps what it measured
        runs.append(run)
        efficiencies(runs, raw, raw_parallel)
        measure.write_json(args.out, {"host": info, "corpus": corpus_info, "raw_mb_per_s": round(raw, 1),
                                      "raw_warm_mb_per_s": round(raw_warm, 1), "raw_parallel": raw_parallel,
                                      "summary": summary(runs), "runs": runs})
        for path in os.listdir(work):  # the outputs' sha256 are in their records
            os.remove(os.path.join(work, path))

    try:  # SFT certified as a user who has the template's official Jinja runs it
        sft = ["sft", *SFT_ARGS, "--reference-template", measure.oracle_file(TEMPLATE, args.reference_template)]
    except SystemExit:
        sft = ["sft", *SFT_ARGS]

    def mine(job: str, workers: int, corpus: str, name: str | None = None) -> dict:
        prefix = os.path.join(work, "ours")
        beside = {}
        if args.adjacent_ceiling and job == "pretrain" and corpus == text and workers in ceilings:
            beside = {"adjacent_ceiling_mb_per_s": round(best_raw(text, workers)[0], 1)}
        m = measure.run(measure.qwen_data_command(*(["pretrain"] if job == "pretrain" else sft), corpus, "-o",
                                                  measure.fresh(prefix), "--workers", workers, "--quiet"))
        out = record(name or job, workers, corpus, m, prefix)
        if beside:
            out |= beside | {"vs_adjacent_ceiling": round(out["mb_per_s"] / beside["adjacent_ceiling_mb_per_s"], 3)}
            print(f"  the host's ceiling just before: {beside['adjacent_ceiling_mb_per_s']} MB/s, "
                  f"{out['vs_adjacent_ceiling']:.3f} of it", flush=True)
        return out

    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    try:
        warm_up([job for job in jobs if not any(key[0] == job for key in done)], corpus_of, mine, work)
        for job in jobs:
            for n in counts:
                for k in range(1 if n == 1 else args.rounds):
                    if (job, n, k + 1) not in done:
                        add(mine(job, n, corpus_of[job]) | ({"round": k + 1} if args.rounds > 1 and n > 1 else {}))
        if repeated is not None and args.unique and "pretrain" in jobs and ("pretrain-repeated", top, 1) not in done:
            add(mine("pretrain", top, repeated, "pretrain-repeated"))
        for size in filter(None, args.rss_mb.split(",")):
            add(mine("pretrain", at, corpora.scaled_text_corpus(int(size) * 1_000_000)))
        if args.megatron:
            small, prefix = corpora.scaled_text_corpus(args.megatron_mb * 1_000_000), os.path.join(work, "megatron")
            ours_run = mine("pretrain", at, small)
            theirs = record("megatron", at, small, megatron(args.megatron, small, prefix, at),
                            prefix + "_text_document")
            add(ours_run)
            add(theirs | {"ours_vs_megatron": round(ours_run["mb_per_s"] / theirs["mb_per_s"], 1),
                          "idx_identical": theirs["sha256"][".idx"] == ours_run["sha256"][".idx"]})
        for joined in ((True,) if args.ray_joined_only else (False, True)) if args.ray else ():
            for shards in [int(n) for n in args.ray_shards.split(",") if n] or [at]:
                for k in range(args.ray_rounds):
                    local = mine("pretrain", at, text, "pretrain-beside-ray")
                    add(local | {"round": k + 1})
                    prefix = os.path.join(work, "ray")
                    m = ray(text, prefix, at, joined, shards)
                    phases = [line for line in m.stderr.splitlines() if line.startswith("ray: ")]
                    floor = {}
                    if joined:  # the least this Ray run could take: the local workers' wall and Ray's own share
                        least = ray_floor(at, shards)
                        floor = {"ray_floor_s": least, "local_over_ray_least": round(
                            local["wall_s"] / (local["wall_s"] + least), 3), "ray_over_least": round(
                            m.wall_s / (local["wall_s"] + least), 3)}
                    add(record("ray-joined" if joined else "ray", at, text, m, prefix) | {
                        "ray_log": phases, "shards": shards or "auto", "round": k + 1,
                        "local_over_ray": round(local["wall_s"] / m.wall_s, 3)} | floor)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for line in summary(runs):
        print(" ".join(f"{k} {v}" for k, v in line.items()))
    print(f"wrote {args.out}")


def earlier(path: str, info: dict) -> dict:
    """`--continue`: what `path` holds where this host wrote it since it booted, else {} (a start from nothing)."""
    try:
        with open(path, encoding="utf-8") as f:
            before = json.load(f)
    except FileNotFoundError:
        return {}
    if before.get("host", {}).get("boot_id") != info["boot_id"]:
        raise SystemExit(f"--continue: {path} was written by another host (or before this one booted)")
    return before


def same_corpora(kept: dict, text: dict, sft: dict) -> dict:
    """`--continue`: the SFT corpora of the file and of this call together, where both name the same corpora
    (the text, and each job's SFT records), else SystemExit: the file's runs would stand beside another's."""
    differ = [kept["path"]] if kept["path"] != text["path"] else []
    differ += [kept["sft"][job]["path"] for job, info in sft.items()
               if job in kept["sft"] and kept["sft"][job]["path"] != info["path"]]
    if differ:
        raise SystemExit(f"--continue: the file's runs read {', '.join(differ)}, which this call does not")
    return kept["sft"] | sft


def warm_up(jobs: list[str], corpus_of: dict, mine, work: str) -> None:
    """Each job once, untimed, on its corpus's first ~4 MB: the tokenizer's caches (the rank file, the
    certificate's tables) are built by a host's first run, once, which would otherwise weigh on whichever
    run came first (a 16-worker SFT run on 2 GB took 8.80 s on a fresh host, its warm rerun ~7.1 s)."""
    for job in jobs:
        head = os.path.join(work, f"head-{job}.jsonl")
        with open(corpus_of[job], "rb") as f, open(head, "wb") as out:
            held = 0
            for line in f:
                out.write(line)
                held += len(line)
                if held >= 4_000_000:
                    break
        mine(job, 1, head, f"warm-up ({job})")
        for name in os.listdir(work):  # its outputs: the next job's kind may not write over them
            if name.startswith("ours"):
                os.remove(os.path.join(work, name))


if __name__ == "__main__":
    main()
