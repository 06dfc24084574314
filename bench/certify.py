"""What the certificate costs: whole `qwen-data` commands certified against `--no-certify`, one run (cases, targets,
how to run `big` and `--layers`: bench/README.md; the bigger corpora: corpora.UNIQUE).

Each case runs once certified untimed (the tokenizer's caches are built by a machine's first run, once),
then both ways in turn, N rounds (the order flips every round, so load from others and a warm page
cache favour neither side), every run a whole process timed as a user would time it:
wall, CPU of the process tree, peak summed RSS of the tree (`measure.run`). A case's figures
are the medians over the rounds of certified / no-certify (and of the seconds certified adds). Every
certified run must say `certified: true` and write the same data (the manifest's fingerprint) as
the no-certify one beside it, or the script stops.

    python3 bench/certify.py start sft --rounds 5 [--json OUT]

--cold: every run with an empty cache folder (`XDG_CACHE_HOME`), as a fresh machine's first run (a container's, a
new node's), which derives the tokenizer's tables itself; the untimed warm-up run is then left out.
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile

import measure  # first: this checkout's qwen_data
import corpora
from measure import SFT_ARGS

SMALL = ("start", "pretrain", "sft", "long", "megadocs")
TEMPLATE = "qwen2.5-instruct.jinja"
LONG_BYTES, MEGADOC_BYTES, MEGADOCS = 58_000_000, 1_000_000, 100
# Targets: seconds certified may add, or certified / no-certify ratios.
TARGETS = {"start": {"added_s": 0.1}, "sft": {"added_s": 0.3}, "long": {"wall": 2.0, "rss": 2.0},
           "big-pretrain": {"wall": 1.03}, "big-sft": {"wall": 1.03}}


def texts_joined(source: str, sizes: list[int], manifest: dict):
    """jsonl lines, one a size of `sizes`: each the texts of `corpora.unique_lines`, in order, joined with a blank
    line until it holds that many UTF-8 bytes of text."""
    lines = corpora.unique_lines(source, sum(sizes) + 10_000_000, manifest)  # a margin: lines hold escapes too
    for size in sizes:
        parts, held = [], 0
        while held < size:
            parts.append(json.loads(next(lines))["text"])
            held += len(parts[-1].encode("utf-8")) + 2
        yield json.dumps({"text": "\n\n".join(parts)}, ensure_ascii=False) + "\n"
    lines.close()


def bench_source(given: str | None, build) -> str:
    """A corpus given on the command line, or the bench cache's (corpora.py downloads its packages with apt-get and
    pip: a host without network must be given the file)."""
    try:
        return os.path.abspath(given) if given else build()
    except Exception as error:  # noqa: BLE001 -- any failure to build says the same: give the file
        raise SystemExit(f"the bench corpus is not built here and cannot be ({error}); "
                         "copy it from a host that has it and pass --text FILE / --chats FILE") from error


def cases(names: list[str], args, work: str) -> dict:
    """name -> (qwen-data arguments, the certified run's extra arguments); inputs made as needed."""
    text = lambda: bench_source(args.text, corpora.text_corpus)  # noqa: E731
    chats = lambda: bench_source(args.chats, corpora.chat_corpus)  # noqa: E731
    template = lambda: ["--reference-template", measure.oracle_file(TEMPLATE, args.reference_template)]  # noqa: E731
    small, big = ["--workers", str(args.workers or 2)], ["--workers", str(args.workers or 16)]

    def one_document() -> str:
        with open(os.path.join(work, "one.jsonl"), "w", encoding="utf-8") as f:
            f.write('{"text": "Hello world, a short document."}\n')
        return f.name

    def joined(name: str, sizes: list[int]) -> str:
        return corpora.derived(f"certify/{name}", text(), sum(sizes),
                               lambda manifest: texts_joined(text(), sizes, manifest))

    def unique(name: str, source: str) -> str:
        return corpora.unique_corpus(f"{name}-unique-{args.big_mb}MB.jsonl", source, args.big_mb * 1_000_000)

    made = {
        "start": lambda: (["pretrain", one_document()], []),  # qwen-data's default workers, as a user runs it
        "pretrain": lambda: (["pretrain", text(), *small], []),
        "sft": lambda: (["sft", chats(), *SFT_ARGS, *small], template()),
        "long": lambda: (["pretrain", joined("long-58MB.jsonl", [LONG_BYTES]), *small], []),
        "megadocs": lambda: (["pretrain", joined("megadocs-100x1MB.jsonl", [MEGADOC_BYTES] * MEGADOCS), *small], []),
        "big-pretrain": lambda: (["pretrain", unique("text", text()), *big], []),
        "big-sft": lambda: (["sft", unique("chats", chats()), *SFT_ARGS, *big], template()),
    }
    return {name: made[name]() for name in names}


def described(path: str) -> dict:
    """An input: its size and records, and how it was made where this script made it."""
    with open(path, "rb") as f:
        found = {"path": path, "bytes": os.path.getsize(path), "records": sum(1 for _ in f)}
    if os.path.dirname(path).endswith("certify"):
        with open(path + ".json", encoding="utf-8") as f:
            found["made"] = {k: v for k, v in json.load(f).items() if k != "how"}
    return found


def run(argv: list, extra: list, certified: bool, work: str, cold: bool = False) -> dict:
    """One whole run, its outputs removed after (`cold`: with an empty cache folder, removed after too);
    SystemExit unless its certificate says what was asked."""
    prefix = os.path.join(work, "out", "data")
    env = measure.python_env()
    if cold:
        env["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="cache-", dir=work)
    load = os.getloadavg()[0]  # others share the machine: how busy it was, beside each figure
    flags = extra if certified else ["--no-certify"]
    m = measure.run(measure.qwen_data_command(*argv, "-o", prefix, "--quiet", *flags), cwd=work, env=env)
    with open(prefix + ".json", encoding="utf-8") as f:
        manifest = json.load(f)
    shutil.rmtree(os.path.dirname(prefix))
    if cold:
        shutil.rmtree(env["XDG_CACHE_HOME"])
    certificate = manifest["certificate"]
    if certificate["certified"] != certified:
        raise SystemExit(f"{' '.join(argv)}: certified is {certificate['certified']}: {certificate.get('why')}")
    return {"wall_s": round(m.wall_s, 3), "cpu_s": round(m.cpu_s, 3), "peak_rss_mib": round(m.peak_rss / 2**20, 1),
            "load_before": load, "fingerprint": manifest["fingerprint"],
            "records_checked": certificate.get("records_checked", 0)}


def summary(name: str, rounds: list[dict]) -> dict:
    """Medians over the rounds of certified / no-certify and of what certified adds; the targets met."""
    pairs = [(r["certified"], r["no_certify"]) for r in rounds]
    if any(c["fingerprint"] != n["fingerprint"] for c, n in pairs):
        raise SystemExit(f"{name}: certified and --no-certify wrote different data")
    ratio = lambda key: round(statistics.median(c[key] / n[key] for c, n in pairs), 3)  # noqa: E731
    out = {"wall": ratio("wall_s"), "cpu": ratio("cpu_s"), "rss": ratio("peak_rss_mib"),
           "added_s": round(statistics.median(c["wall_s"] - n["wall_s"] for c, n in pairs), 3),
           "added_cpu_s": round(statistics.median(c["cpu_s"] - n["cpu_s"] for c, n in pairs), 3),
           "certified_wall_s": statistics.median(c["wall_s"] for c, _ in pairs),
           "no_certify_wall_s": statistics.median(n["wall_s"] for _, n in pairs),
           "records_checked": pairs[0][0]["records_checked"]}
    out["targets"] = {key: {"at_most": limit, "met": out[key] <= limit} for key, limit in TARGETS.get(name, {}).items()}
    return out


# The reference alone on a case's input, in its own process: the command's step built as the CLI builds it, its
# chunks made by the worker's code with the run's sample picked, then HF's tokenizer (and the template) loaded and
# the picked records checked as a checking process checks them: the CPU seconds of those two, a JSON line.
REFERENCE = """
import itertools, json, pickle, sys, time
from qwen_data import cli
from qwen_data.certify.checks import checks_for
from qwen_data.inputs.files import expand
from qwen_data.inputs.readers import estimated_records, read_chunks
from qwen_data.run.pipeline import input_list

def reference(step, args):
    step.prepare()
    sources = expand(step.config.inputs)
    step.checks = checks_for(step, input_list(sources), [estimated_records(s) for s in sources])
    items = [(f"{n}", item) for n, chunk in enumerate(read_chunks(sources)) for item in step.process(chunk).to_check]
    side = pickle.loads(pickle.dumps(step.checks))  # what a checking process is sent
    began = time.process_time()
    side.load()
    loaded = time.process_time()
    counts, mismatch = side.check(items)
    print(json.dumps({"load_cpu_s": loaded - began, "check_cpu_s": time.process_time() - loaded,
                      "records": counts.get("records_checked"), "mismatch": mismatch}))
    raise SystemExit(0)

cli.execute = reference
sys.exit(cli.main(sys.argv[1:]))
"""


def reference_cpu(argv: list, extra: list, work: str) -> dict:
    """The reference's own CPU on a case's input (REFERENCE): what a certified run must spend beyond
    --no-certify's work, whatever else it does."""
    m = measure.run([sys.executable, "-c", REFERENCE, *argv, "-o", os.path.join(work, "ref", "data"), "--quiet",
                     *extra], cwd=work)
    found = json.loads(m.stdout.strip().splitlines()[-1])
    if found["mismatch"]:
        raise SystemExit(f"{' '.join(argv)}: the reference alone found a mismatch: {found['mismatch']}")
    return found


def least_added(case: dict, cores: int) -> float:
    """The least wall a certified run adds on `cores` cores given its reference's CPU: it must do --no-certify's
    work (median CPU) and the reference's, so it takes at least their sum over the cores."""
    reference = case["reference"]["load_cpu_s"] + case["reference"]["check_cpu_s"]
    s = case["summary"]
    no_certify_cpu = statistics.median(r["no_certify"]["cpu_s"] for r in case["rounds"])
    return round(max(0.0, (no_certify_cpu + reference) / cores - s["no_certify_wall_s"]), 3)


# --layers: a run with every document spelled but no reference sample, in its own process (its certificate says so,
# only its time is used)
SPELLING_ONLY = """
import sys
from qwen_data.certify import checks, sample
from qwen_data.run import certifier
from qwen_data.cli import main
# nothing picked, whichever way a step asks (SFT per record, pretraining per chunk's keys), and nothing loaded to check it
sample.Sampling.picker = lambda self, path: lambda record: False
sample.Sampling.picked = lambda self, keys, lines=False: []
certifier.Certifier.early = staticmethod(lambda *args, **kwargs: [])
checks.TextChecks.check = checks.ChatChecks.check = lambda self, items: (dict(), None)
sys.exit(main(sys.argv[1:]))
"""
LAYERS = {"no-certify": ["-m", "qwen_data", "{kind}", "--no-certify"],
          "spelled only": ["-c", SPELLING_ONLY, "{kind}"],
          "certified": ["-m", "qwen_data", "{kind}"]}


def layers(args) -> None:
    """Each layer's cost on one corpus: `qwen-data pretrain` (`sft` with --sft) in each way of LAYERS, interleaved,
    --rounds rounds: wall and CPU seconds of each."""
    kind, extra = ("sft", [*SFT_ARGS, "--reference-template", measure.oracle_file(TEMPLATE, args.reference_template)]
                   ) if args.sft else ("pretrain", [])
    seconds: dict[str, list[float]] = {name: [] for name in LAYERS}
    cpu: dict[str, list[float]] = {name: [] for name in LAYERS}
    with tempfile.TemporaryDirectory() as out:
        for r in range(args.rounds or 2):
            for name, command in LAYERS.items():
                m = measure.run([sys.executable, *[c.format(kind=kind) for c in command], os.path.abspath(args.layers),
                                 *extra, "-o", measure.fresh(f"{out}/p"), "--workers", args.workers or 16, "--quiet"])
                seconds[name].append(round(m.wall_s, 3))
                cpu[name].append(round(m.cpu_s, 2))
            print(f"round {r + 1}: " + ", ".join(f"{name} {s[-1]:.2f} s ({cpu[name][-1]:.1f} CPU s)"
                                                 for name, s in seconds.items()), flush=True)
    if args.json:
        measure.write_json(args.json, {"corpus": args.layers, "kind": kind, "workers": args.workers or 16,
                                       "seconds": seconds, "cpu_seconds": cpu})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*", help=f"any of {', '.join(SMALL)}, big (default: all but big)")
    parser.add_argument("--rounds", type=int, help="default 3; --layers: 2")
    parser.add_argument("--workers", type=int, help="pool workers (default: 2; big and --layers: 16)")
    parser.add_argument("--reference-template", metavar="FILE", help=f"the official {TEMPLATE} (sft, big)")
    parser.add_argument("--text", metavar="FILE", help="the bench text.jsonl (default: bench/corpora.py's cache)")
    parser.add_argument("--chats", metavar="FILE", help="the bench chats.jsonl (default: bench/corpora.py's cache)")
    parser.add_argument("--big-mb", type=int, default=1000, help="big's text and chats, each (MB)")
    parser.add_argument("--json", metavar="PATH", help="write the results here (after every round)")
    parser.add_argument("--layers", metavar="CORPUS", help="each layer's cost on this corpus instead (no cases)")
    parser.add_argument("--sft", action="store_true", help="--layers: sft, certified against --reference-template")
    parser.add_argument("--cold", action="store_true", help="every run with an empty cache folder (a fresh machine)")
    parser.add_argument("--floor", action="store_true",
                        help="also the reference alone on each case's input (its CPU) and the least wall it adds")
    args = parser.parse_args()
    if args.layers:
        return layers(args)
    unknown = set(args.cases) - {*SMALL, "big"}
    if unknown:
        raise SystemExit(f"unknown cases {sorted(unknown)}: choose among {', '.join(SMALL)}, big")
    args.rounds = args.rounds or 3
    work = tempfile.mkdtemp(prefix="qwen-data-certify-")
    try:
        todo = cases([c for name in args.cases or SMALL for c in (["big-pretrain", "big-sft"] if name == "big"
                                                                    else [name])], args, work)
        results = {"host": {"cores": len(os.sched_getaffinity(0)), "cpu": measure.cpu_model(),
                            "python": platform.python_version()}, "cold": args.cold,
                   "rounds": args.rounds, "method": __doc__.split("\n\n")[1], "corpora": corpora.UNIQUE, "cases": {}}
        for name, (argv, extra) in todo.items():  # warm-up, untimed: the tokenizer's caches built, the input read once
            if not args.cold:
                run(argv, extra, True, work)
            if args.floor:
                results["cases"][name] = {"reference": reference_cpu(argv, extra, work)}
        for k in range(args.rounds):  # each case both ways, the order flipped every round
            for name, (argv, extra) in todo.items():
                pair = {("certified" if c else "no_certify"): run(argv, extra, c, work, args.cold)
                        for c in ((True, False) if k % 2 == 0 else (False, True))}
                print(f"round {k + 1} {name}: certified {pair['certified']['wall_s']:.2f} s, "
                      f"--no-certify {pair['no_certify']['wall_s']:.2f} s", flush=True)
                case = results["cases"].setdefault(name, {})
                case.update({"command": ["qwen-data", *argv], "certified_adds": extra, "input": described(argv[1]),
                             "rounds": case.get("rounds", []) + [pair]})
                case["summary"] = summary(name, case["rounds"])
                if "reference" in case:
                    case["summary"]["least_added_s"] = least_added(case, results["host"]["cores"])
            if args.json:
                measure.write_json(args.json, results, depth=4)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for name, case in results["cases"].items():
        s = case["summary"]
        goals = ", ".join(f"{k} <= {t['at_most']}: {'met' if t['met'] else 'NOT met'}"
                          for k, t in s["targets"].items())
        least = f"{s['least_added_s']:+.2f}" if "least_added_s" in s else "-"
        rows.append([name, f"{s['certified_wall_s']:.2f}", f"{s['no_certify_wall_s']:.2f}", f"{s['wall']:.2f}x",
                     f"{s['added_s']:+.2f}", least, f"{s['cpu']:.2f}x", f"{s['rss']:.2f}x", s["records_checked"],
                     goals or "-"])
    measure.print_table(rows, ["case", "certified s", "no-certify s", "wall", "added s", "least added", "cpu",
                               "peak RSS", "checked", "target"])


if __name__ == "__main__":
    main()
