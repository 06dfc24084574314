"""`--executor ray`: a run cut into shards, each a Ray task on some node of a cluster, then merged.

    driver: lock the step's final outputs → the parts an earlier run of the same command finished,
    checked and reused → N tasks (the shards), each running one of the first N parts, then the next part not
    taken (`tally.Tally`) until none is left, each part `pipeline.run(Step(config with shard=Shard(j, P, span)))`
    made in a folder of the task's node (`_Placing`), its .bin bytes then written by the task into the output's
    start (PREFIX.shards/joined/, `_Heads`) where the tally says once every part before it told its sizes, its
    other files moved to PREFIX.shards/j → `merge` per output prefix, taking what was joined → all committed
    together → PREFIX.shards removed

Why a shard runs parts rather than one contiguous Nth of the input: a part's bytes can go into the output
only once every part before it is made. N contiguous shards end together, and every byte but the first
shard's was copied after the last task (with 16 shards of 8 GB, 3.8 s after 13 s of tasks). Parts (of
about PART_BYTES: `plan`) handed out in order end in order, give or take the N running, and each is placed
while the next ones run: what is left at the end is the last few. The tasks end within about a part of each
other, where contiguous shards differed by their stretch's text (10.4-12.1 s), and so did tasks given every
Nth part (their sums differed by up to ~2.5 s: `bench/results/cpu/2026-12-02b`). Why the tasks place the bytes:
written under PREFIX.shards/ and copied by the driver, every byte went through the output's page cache twice, and
on 16 GB the kernel's writeback held the driver's copy 3.1-4.3 s past the tasks (`bench/results/cpu/2026-12-03g`).

The output prefix (-o) must be on a file system every node sees (NFS, Lustre, a mounted bucket...):
every task writes its parts' bytes and files under `PREFIX.shards/` and the driver merges them from there. The
inputs must be readable at the same paths on every node too, and the driver's working directory
(tasks run in it, so relative paths mean what they mean to the driver); every node needs the same
qwen-data and tokenizer files installed. The result is byte for byte what one local run over the
same inputs writes (`merge` guarantees it); only the manifest's `command`, `created` and
`wall_seconds` (the whole run's, Ray's start included) differ. `--workers` does not apply.

A part that starts inside a jsonl file numbers its lines from the newlines before its start. Those are
counted once per file, in pieces between two parts' starts, by small tasks (one CPU) all sent at once, a
piece each for the first round of parts and about a shard's share of the pieces each for the others; each
part fetches its pieces' counts (`_newline_counts`), where a shard on its own (`--shard`) reads the file up
to its start.

Tasks take one CPU each (`num_cpus=1`) and tokenize in their own process (`workers=0`): a task
is the worker, and a forked one would only add a second process per CPU. The tokenizer's cache
then grows with the text a task's process encodes, up to `tokenizer.SHARED_TEXT_BUDGET` characters
(then the tokenizer is built anew), instead of being reset when a local worker outgrows its share
of `pipeline.WORKER_CACHES`. A task whose process dies (killed, out of memory, node
lost) is run again by Ray, up to `RETRIES` times, and so is one that fails with an OSError (a
shared file system's hiccup). Any other error (bad input: a ValueError; too many rejects ...) is
not retried: the run stops at once, the other tasks are cancelled, and the error
names the part and the cause. A failed run leaves no final output: the final files are committed
only after every merge succeeded.

Resuming: a run killed or interrupted (SIGKILL, SIGTERM, Ctrl-C), or failed for a reason that is
not its data's (a task's process or node lost on every attempt, an OSError, Ray failing), keeps its
finished parts, and the same command run again reuses them and runs only the others, ending with
the bytes and the certificate of a run never stopped. `PREFIX.shards/` belongs to the executor.
Its run.json, written before any task starts, names the run (`journal.identity`: its settings but
--workers, and its inputs' pins), the shard count and the part count (a rerun without --ray-shards takes
those recorded: the default depends on the cluster's CPUs); a folder of another run (other settings,
inputs or counts) is removed as the run starts. As a part ends, the driver saves its
picked records beside it (K.picked, with its manifests' fingerprints and its rejects file's sha256).
A part's .bin bytes lie in the heads only, where K.placed (written by its task once they are there) says;
a rerun puts them back out first (`_Heads.restore`). A part made but not placed when the run stopped (its bytes
waited for a part before it) is made again, and so is one whose task died before placing it.
Nothing reused is trusted: a part is reused only where its manifests name this part and this
run's tokenizer, its files hash to their fingerprint (`formats.integrity`), its rejects file and
manifests are those its picked records were saved with, and those records read back from its files
(`certify.checks.read_back`, as a local run reads back its own); the resuming driver then checks
them against the reference as it checks a fresh part's. Any other part is done again ("ray:
part K redone: why" on stderr); a task retried by Ray runs only its parts not ended. A run failed by its
data (bad input, a certificate mismatch, too many rejects, nothing to write) removes `PREFIX.shards/`, since a
rerun would fail the same way, and so does a run that commits. The tasks' folders on their nodes are removed by
each task as it ends (one killed, by the next task of the run on that node) and, on the driver's, by the driver.

The certificate: tasks pick records as a local run does but do not check them (a task would load
the reference libraries itself, ~0.5-2 s of its CPU); they report them with their progress, about
once a second, and hand them all back with their manifests. The driver checks them in one process
of its own, forked before Ray starts, which loads the reference while the tasks run and checks the
records as they are reported, each once (`_DriverChecks.shard`): checked only as each task ended,
all of them had waited for the last task (a tail of ~0.7 s at 3,000 records, 2 cores).
A mismatch fails the run before anything is committed, as locally.

Progress: tasks report absolute per-part totals to a small actor (a retried part starts again
from zero, so nothing is counted twice), and each part as it ends (once placed); the driver asks it every
PART_POLL_SECONDS for the parts ended (recorded in the heads at once), and shows the sum about once a second (of
the parts run: a rerun's reused ones are not shown).

Without an address a local Ray instance starts, with every CPU of the machine (`RAY_OVERRIDE_RESOURCES=
'{"CPU": 4}'` gives fewer); it takes a few seconds ("ray: started a local instance in X s" on stderr
unless --quiet) and it is shut down once the shards are done, in a thread, while the driver merges (its
processes take a second or two to end). A joined cluster (`address`, or $RAY_ADDRESS) is only
disconnected from, and a Ray this process already started or joined is used as it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import hashlib
import importlib
import itertools
import json
import logging
import math
import os
import pickle
import re
import shutil
import sys
import tempfile
import threading
import time

from ..certify.checks import CertificateError, checks_for
from ..errors import describe
from ..formats.claims import check as check_outputs
from ..formats.claims import dataset_owner
from ..formats.layouts import layout_of
from ..formats.manifest import Manifest
from ..formats.outputs import AtomicOutputs, atomic_file
from ..inputs.files import STDIN, Shard, expand
from ..inputs.jsonl import newlines_in
from ..inputs.readers import counted_until, estimated_records
from ..inputs.records import EmptyOutput
from . import kept, pipeline
from .certifier import take
from .journal import identity
from .merge import Head, PartReads, _copy_bytes, restore
from .tally import Tally
from .progress import Progress

# What Ray's first remote call imports (its serializers: 0.11-0.16 s of a 16-core host's driver before any task was
# sent, 0.26 s on 2 cores), imported while the driver waits for Ray to start or join, which it does idle (~1 s).
SERIALIZERS = ("pydantic", "ray._common.pydantic_compat", "pyarrow", "pyarrow.json", "ray._private.arrow_serialization")
RETRIES = 3  # per task, for a dead process or a retryable exception
RETRY_EXCEPTIONS = [OSError]
# A part's input bytes, about: a part takes ~0.7 s on a core and is placed into the output as it ends; only
# the last few parts wait after the tasks end (with 16 contiguous shards of 8 GB, 15/16 of the bytes were copied
# after: 3.8 s). A part's own cost (its step, files, manifest) is ~10-15 ms; parts of 96 MB ran no faster
# (bench/results/cpu/2026-12-02b).
PART_BYTES = 32 << 20
TAIL_SHARE = 4  # the last round of parts, this many times smaller (`cuts`)
POLL_SECONDS = 1.0  # how often the driver shows progress
PART_POLL_SECONDS = 0.2  # how often it asks for the parts that ended, to join them
CANCEL_WAIT_SECONDS = 30.0  # how long a failed run waits for the cancelled tasks to end
SHARDS_SUFFIX = ".shards"
STAGING = "merged"  # PREFIX.shards/merged/out*: the merges, before they are committed under PREFIX
HEADS = "joined"  # PREFIX.shards/joined/: the output's .bin files, the parts' bytes placed in them (`_Heads`)
MARKS = "began"  # PREFIX.shards/began/K: task K's first attempt began (a retry finds it, and asks the tally)
PLACED_SUFFIX = ".placed"  # PREFIX.shards/K.placed: where part K's .bin bytes lie in the heads (`_Placing`)
MEMORY = "/dev/shm"  # where a node's tasks make their parts (`staging`), where it has STAGING_ROOM free
STAGING_ROOM = 4 << 30  # a task holds a few parts' bytes at most (those whose place is not known yet): ~100 MB
PLACE_POLL_SECONDS = 0.01  # how often a task whose parts are all made asks where its last ones go
PLACE_WAIT_SECONDS = 600.0  # how long it waits for the parts before them to end (their task retried meanwhile)


class ShardFailed(RuntimeError):
    """A task failed on a part (and was not, or no longer, retried); `shard` (the part's) and `cause` say which
    and why."""

    def __init__(self, message: str, shard: Shard, cause: BaseException | None) -> None:
        super().__init__(message)
        self.shard = shard
        self.cause = cause


class ShardInputError(ShardFailed, ValueError):
    """A part failed on its input (the task raised a ValueError): bad data, never retried."""


def run_on_ray(step: pipeline.Step, address: str | None = None, shards: int | None = None,
               info: dict | None = None) -> list[Manifest]:
    """`step` (`pretrain.Tokenize`, `sft.ChatSamples`) as `shards` Ray tasks taking the inputs' parts in turn,
    merged into the step's output prefixes; their manifests, in the order of `step.prefixes()`. The step is
    only asked what it writes here: a task builds one for each part, `type(step)(config of the part)`.

    `address`: the Ray cluster to join (None: start a local one, or use the one this process already joined).
    `shards`: how many (None: `plan`'s, one a CPU). `info`, when given, is filled as the run goes:
    ray_start_seconds (0 when joined), cpus, shards, parts, reused (the parts an earlier run of the same command
    left and this one reused), attempts (per part run), tasks_seconds, task_start_seconds, shard_seconds and
    shard_cpu_seconds (each part's time and CPU), timeline (each part's index, start, end and when the driver took
    it, in seconds after the tasks were sent), task_starts (each task's start, its tally's first answer and its
    first part's start, so), ray_stop_seconds (if started here), merge_seconds."""
    start, config, info = time.monotonic(), step.config, {} if info is None else info
    sources = _inputs(config)
    inputs = pipeline.input_list(sources)
    final = step.prefixes()
    suffixes = [_suffix(p, config.output_prefix) for p in final]
    # The final files stay locked for the whole run, as a local run's do: a second run writing
    # any of them (or using PREFIX.shards/) is refused before anything starts.
    check_outputs(step.files() + [config.rejects_path], [s.path for s in sources], dataset_owner(final, step.kind))
    with AtomicOutputs(step.files() + [config.rejects_path]) as outputs:
        shards_kept = kept.Kept(config.output_prefix + SHARDS_SUFFIX, identity(config, inputs), inputs)
        shards_kept.recorded = kept.recorded(shards_kept.directory, shards_kept.run, shards)
        if shards_kept.recorded is None:  # another run's shards (other settings, inputs or count), or none
            shutil.rmtree(shards_kept.directory, ignore_errors=True)
        checks = _DriverChecks(type(step)(config), inputs, sources) if config.certify else None  # forks: before Ray
        heads = _Heads(os.path.join(shards_kept.directory, HEADS), suffixes)  # (each merge's start, made as shards end)
        try:
            configs, results, stopping = _run_shards(type(step), config, sources, address, shards, info, checks,
                                                     shards_kept, heads)
            try:
                _check_not_empty(config.output_prefix, [r[0] for r in results])
                t = time.monotonic()
                manifests = _merge(configs, suffixes, final, outputs, config, start, checks, heads)
                info["merge_seconds"] = round(time.monotonic() - t, 3)
                if not config.quiet:
                    print(f"ray: merged and committed in {info['merge_seconds']:.1f} s", file=sys.stderr)
            finally:
                if stopping is not None:
                    stopping.join()
        except BaseException as exc:
            kept.left(exc, shards_kept.directory, config.quiet)
            raise
        finally:
            heads.close()
            if checks is not None:
                checks.end()
        shutil.rmtree(shards_kept.directory, ignore_errors=True)  # merged and committed: the shards are done with
    return manifests


def plan(sources, cpus: int, chunk_bytes: int, shards: int | None = None) -> tuple[int, int]:
    """(shards, parts): `shards` tasks (default: one a CPU, but no more than there are pieces to hand out: a
    chunk of an uncompressed jsonl file, a whole file of any other kind, parquet counted by size like jsonl),
    and the inputs cut into parts of about PART_BYTES (as many rounds of `shards` parts as that takes), no more
    than there are pieces, and at least one a shard (the last rounds smaller: `cuts`)."""
    total = sum(s.size for s in sources)
    pieces = sum(max(1, math.ceil(s.size / chunk_bytes)) if s.splittable or s.kind == "parquet" else 1
                 for s in sources)
    shards = shards or max(1, min(cpus, pieces))
    rounds = max(1, math.ceil(total / (shards * PART_BYTES)))
    return shards, max(shards, min(pieces, shards * rounds))


def cuts(total: int, tasks: int, parts: int) -> list[int] | None:
    """Where `parts` parts of inputs of `total` bytes start (and the last stops), for `tasks` tasks: the last round
    of parts 1/TAIL_SHARE the size of the first ones, the parts before it shrinking towards it by (1 - 1/tasks) a
    part; None where there are fewer than three rounds (parts of one size, `Shard.stretch`).

    Why: with parts of one size, 16 tasks' last parts ended on average 0.16-0.42 s a run before the last one,
    about half a part's time (16-core hosts: bench/results/cpu/2026-12-02c). Why gradually: a part's bytes are
    joined only once every part before it is done, and a part starts about 1/tasks of a part's time after the one
    before it; shrinking faster, the small parts ended before the last big ones and waited to be joined (two
    rounds a quarter the size at once: the merge after the tasks took 0.51-0.55 s against 0.23-0.49,
    bench/results/cpu/2026-12-02d)."""
    if parts < 3 * tasks:
        return None
    grow = 1 / (1 - 1 / tasks)
    weights = [min(TAIL_SHARE, grow ** max(0, parts - 1 - k - (tasks - 1))) for k in range(parts)]
    whole = sum(weights)
    return [0] + [int(total * end / whole) for end in itertools.accumulate(weights)][:-1] + [total]


# -- the driver ------------------------------------------------------------------------------------
def _suffix(prefix: str, output_prefix: str) -> str:
    """What an output prefix adds to -o (pretrain with several keys: _KEY)."""
    absolute = os.path.abspath(prefix)
    if not absolute.startswith(os.path.abspath(output_prefix)):
        raise ValueError(f"{prefix}: an output prefix that does not start with -o {output_prefix}")
    return absolute[len(os.path.abspath(output_prefix)):]


def _connect(address: str | None, quiet: bool, info: dict):
    """Ray, initialised; whether this call started it (then it is shut down at the end)."""
    try:
        import ray
    except ImportError:
        raise RuntimeError("--executor ray needs Ray: pip install 'qwen-data[ray]'") from None
    if ray.is_initialized():  # a caller (a test, a notebook) joined or started one already
        info["ray_start_seconds"] = 0.0
        return ray, False
    t = time.monotonic()
    threading.Thread(target=_import, args=(SERIALIZERS,), name="ray-serializers", daemon=True).start()
    local = address is None and not os.environ.get("RAY_ADDRESS")
    quiet_init = dict(log_to_driver=False, logging_level=logging.ERROR)
    where = "start a local Ray instance" if local else f"join the Ray cluster at {address or os.environ['RAY_ADDRESS']}"
    try:
        if local:  # ("local": a new instance; without it Ray joins a cluster `ray start` left running on this host)
            ray.init(address="local", include_dashboard=False, **quiet_init)
        else:
            ray.init(address=address, **quiet_init)
    except Exception as exc:  # (a ConnectionError would read as a problem with the output files)
        lines = str(exc).strip().splitlines()
        raise RuntimeError(f"could not {where}: {lines[0] if lines else type(exc).__name__}") from exc
    seconds = time.monotonic() - t
    info["ray_start_seconds"] = round(seconds, 3) if local else 0.0
    if not quiet:
        print(f"ray: started a local instance in {seconds:.1f} s" if local
              else f"ray: joined the cluster at {address or os.environ['RAY_ADDRESS']} in {seconds:.1f} s",
              file=sys.stderr)
    return ray, True


def _import(modules: tuple[str, ...]) -> None:
    """`modules` imported, those that are not there left out."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # (another Ray's layout: its first call imports what it needs itself)
            pass


def _inputs(config) -> list:
    if config.shard is not None:
        raise ValueError("the Ray executor makes the shards itself: leave out --shard")
    sources = expand(config.inputs, config.hf_split)
    if any(s.path == STDIN for s in sources):
        raise ValueError("the Ray executor cannot read standard input (-): give files every node can read")
    return sources


def _run_shards(step_type, config, sources: list, address: str | None, shards: int | None, info: dict,
                checks: "_DriverChecks | None", shards_kept: kept.Kept,
                heads: "_Heads") -> tuple[list, list[list[Manifest]], threading.Thread | None]:
    """Ray joined (or started), the shards an earlier run of this command left checked and reused, the
    others run as its tasks, Ray left: each shard's config and manifests, and the thread stopping the Ray
    started here once every shard is done (its processes take a second or two to end: the driver merges
    meanwhile, and joins the thread before returning)."""
    ray, started = _connect(address, config.quiet, info)
    stopping = None
    try:
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        # (the default depends on the cluster's CPUs: a run that resumes takes what it recorded)
        tasks, count = shards_kept.recorded or plan(sources, cpus, config.chunk_bytes, shards)
        info.update(cpus=cpus, shards=tasks, parts=count, attempts={})
        if not config.quiet:
            print(f"ray: {tasks} shards on {cpus} CPUs, taking {count} parts in turn, under {shards_kept.directory}/",
                  file=sys.stderr)
        spans = cuts(sum(s.size for s in sources), tasks, count)
        configs = [dataclasses.replace(config, shard=Shard(k, count, span=spans and (spans[k], spans[k + 1])),
                                       workers=0, quiet=True, check_here=False,
                                       output_prefix=os.path.join(shards_kept.directory, str(k))) for k in range(count)]
        kept.record(shards_kept, tasks, count)  # before any task starts: what the parts under it are the parts of
        shutil.rmtree(os.path.join(shards_kept.directory, STAGING), ignore_errors=True)  # an earlier merge's
        if shards_kept.recorded:
            heads.restore()
        results = (kept.reuse(step_type, configs, shards_kept.inputs, sources, checks, config.quiet)
                   if shards_kept.recorded else {})
        info["reused"] = sorted(results)
        heads.begin([c.output_prefix for c in configs], set(results))
        heads.ready(results)
        run = [c for c in configs if c.shard.index not in results]
        if run:
            t = time.monotonic()
            _run_tasks(ray, step_type, run, tasks, sources, config, info, checks, results, heads)
            info["tasks_seconds"] = round(time.monotonic() - t, 3)
            _tell_done(len(run), info, config.quiet)
        if started:
            stopping = threading.Thread(target=_stop, args=(ray, info), name="ray-shutdown", daemon=True)
            stopping.start()
        return configs, [results[k] for k in range(count)], stopping
    finally:
        if started and stopping is None:  # failed or interrupted: stopped before the error goes on
            _stop(ray, info)


def _tell_done(run: int, info: dict, quiet: bool) -> None:
    if quiet:
        return
    retried = sum(n - 1 for n in info.get("attempts", {}).values())
    took, cpu = sorted(info["shard_seconds"]), sorted(info["shard_cpu_seconds"])
    # (its CPU beside its time: a task that took longer than it computed waited for a core)
    each = (f"each part {took[0]:.1f}-{took[-1]:.1f} s, median {took[len(took) // 2]:.1f}, its CPU "
            f"{cpu[0]:.1f}-{cpu[-1]:.1f} s; ") if took else ""
    print(f"ray: {run} parts done in {info['tasks_seconds']:.1f} s ({each}the last task's code began "
          f"{info['task_start_seconds']:.1f} s after it was sent)"
          + (f" ({retried} attempts repeated)" if retried else ""), file=sys.stderr)


def _stop(ray, info: dict) -> None:
    t = time.monotonic()
    ray.shutdown()
    info["ray_stop_seconds"] = round(time.monotonic() - t, 3)


def _run_tasks(ray, step_type, configs: list, tasks: int, sources: list, config, info: dict,
               checks: "_DriverChecks | None", results: dict[int, list[Manifest]], heads: "_Heads") -> None:
    """The parts of `configs` run by `tasks` Ray tasks, each taking one of the first `tasks` parts, then the next
    part not taken (`Tally.next`) until none is left; each part's end taken as it comes (`_Ended`); on the first
    failure, the other tasks cancelled and a ShardFailed naming the part."""
    counts = _newline_counts(ray, sources, configs, tasks)  # (first: Ray starts its processes while the actor is made)
    first = [c.shard.index for c in configs[:tasks]]  # each task's first part, taken without asking the tally
    tally = ray.remote(num_cpus=0)(Tally).remote([c.shard.index for c in configs], first, heads.sizes(results))
    marks = os.path.join(os.path.dirname(configs[0].output_prefix), MARKS)
    shutil.rmtree(marks, ignore_errors=True)  # (an earlier run's)
    os.makedirs(marks)
    task = ray.remote(_shard_task).options(num_cpus=1, max_retries=RETRIES, retry_exceptions=RETRY_EXCEPTIONS)
    parts = ray.put({c.shard.index: c for c in configs})  # (once in the object store, for every task)
    refs = {task.remote(step_type, parts, os.getcwd(), tally, k, (first[k], marks), *counts): k
            for k in range(len(first))}
    ended = _Ended(configs, info, checks, results, heads)
    pending = list(refs)
    total = sum(s.size for s in sources)
    total_bytes = sum(high - low for low, high in (c.shard.stretch(total) for c in configs))
    progress = Progress(total_bytes, enabled=not config.quiet, label="ray")
    polled = shown = time.monotonic()
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=PART_POLL_SECONDS)
            for ref in done:
                try:
                    for part in ray.get(ref):
                        ended(*part)
                except Exception as exc:
                    _poll(ray, tally, progress, info, checks, ended)
                    held = _held(ray, tally, refs[ref])  # (the part its task failed on; None: before any)
                    shard = next(c.shard for c in configs if c.shard.index == held or
                                 (held is None and c.shard.index not in results))
                    attempts = info.get("attempts", {}).get(shard.index, 1)
                    raise _failure(ray, exc, shard, attempts, config.output_prefix) from None
            if (now := time.monotonic()) - polled >= PART_POLL_SECONDS:
                show = now - shown >= POLL_SECONDS
                _poll(ray, tally, progress if show else None, info, checks, ended)
                polled, shown = now, now if show else shown
        _poll(ray, tally, progress, info, checks, ended)
        progress.close()
    finally:
        if pending:  # failed, or interrupted: stop the others before their files are removed
            for ref in pending:
                ray.cancel(ref, force=True)
            ray.wait(pending, num_returns=len(pending), timeout=CANCEL_WAIT_SECONDS)
        try:
            ray.kill(tally)
        except Exception:  # (Ray itself failing: the error that brought us here says more)
            pass


def _held(ray, tally, task: int) -> int | None:
    """The part task `task` held when it failed (None where the tally cannot say)."""
    try:
        return ray.get(tally.held_by.remote(task), timeout=10)
    except Exception:
        return None


class _Ended:
    """Each part's end, taken once (told by the tally as it ends, then again with its task's result): its
    manifests put in `results` by part, its time in `info`, its picked records handed to `checks` and saved
    beside it (`kept.keep_picked`), its files handed to `heads`."""

    def __init__(self, configs: list, info: dict, checks: "_DriverChecks | None",
                 results: dict[int, list[Manifest]], heads: "_Heads") -> None:
        self.sent = time.time()  # (the tasks' clocks: time.time, not monotonic)
        self.by_index = {c.shard.index: c for c in configs}
        self.info, self.checks, self.results, self.heads = info, checks, results, heads
        info["task_start_seconds"], info["shard_seconds"], info["shard_cpu_seconds"], info["timeline"] = 0.0, [], [], []
        info["task_starts"] = []

    def __call__(self, index: int, manifests: list[Manifest], picked: list, times: tuple) -> None:
        if index in self.results:
            return
        self.results[index], info = manifests, self.info
        began, finished, cpu, first = times
        if first:  # its task's first part: when the task's code began, the tally answered it, the part began
            info["task_start_seconds"] = round(max(info["task_start_seconds"], began - self.sent), 3)
            info["task_starts"].append(tuple(round(t - self.sent, 3) for t in (*first, began)))
        info["shard_seconds"].append(round(finished - began, 3))
        info["shard_cpu_seconds"].append(round(cpu, 3))
        # (its place in the run: when it began and ended, after the tasks were sent, and when the driver took it)
        info["timeline"].append((index, round(began - self.sent, 3), round(finished - self.sent, 3),
                                 round(time.time() - self.sent, 3)))
        if self.checks is not None:
            self.checks.shard(index, 0, picked)
        kept.keep_picked(self.by_index[index], manifests, picked)  # the part is finished: a rerun reuses it
        self.heads.read_ahead(self.by_index[index].output_prefix)
        self.heads.ready(self.results)


def _newline_counts(ray, sources: list, configs: list,
                    tasks: int) -> tuple[dict[str, list], dict[int, tuple[str, int]]]:
    """For each part of `configs` that starts inside a plain jsonl file, where the counts that sum to the newlines
    before its first line are (`Shard.newlines_before`): (per file, in order, (the reference of a Ray task counting
    the file in pieces from one part's start to the next, those pieces' number); per part, (its file, how many of
    those pieces lie before it)). Each file is counted once, all at once: a piece a task for the first `tasks`
    parts' starts (the first parts wait on nothing longer), then `tasks` tasks each counting its share of the
    others (a task a piece would be a call a part, all sent before any shard: 30,000 for a terabyte). A part
    counting the file's start itself would read what every part before it reads (16 shards of 8 GB read 64 GB so,
    2-3 s at most of each task)."""
    count = ray.remote(_newlines_in_pieces).options(num_cpus=1, max_retries=RETRIES, retry_exceptions=RETRY_EXCEPTIONS)
    starts: dict[str, list[tuple[int, int]]] = {}
    for c in configs:
        where = counted_until(sources, c.shard)
        if where is not None:
            starts.setdefault(where[0], []).append((where[1], c.shard.index))
    pieces: dict[str, list] = {}
    before: dict[int, tuple[str, int]] = {}
    for path, ends in starts.items():
        ends, counted, begin, done = sorted(ends), pieces.setdefault(path, []), 0, 0
        size = max(1, math.ceil((len(ends) - tasks) / tasks))
        for group in [ends[k:k + 1] for k in range(min(tasks, len(ends)))] + [
                ends[k:k + size] for k in range(tasks, len(ends), size)]:
            bounds = [begin] + [end for end, _ in group]
            counted.append((count.remote(os.path.join(os.getcwd(), path), bounds), len(group)))
            for n, (_, part) in enumerate(group, start=done + 1):
                before[part] = (path, n)
            begin, done = bounds[-1], done + len(group)
    return pieces, before


def _newlines_in_pieces(path: str, bounds: list[int]) -> list[int]:
    """The newlines in each piece [bounds[k], bounds[k + 1]) of the file at `path`."""
    return [newlines_in(path, a, b) for a, b in zip(bounds, bounds[1:])]


def _poll(ray, tally, progress: Progress | None, info: dict, checks: "_DriverChecks | None", ended: "_Ended") -> None:
    """The shards' totals shown (where `progress`), the records they picked since the last poll handed to
    `checks`, and the parts that ended since, to `ended`."""
    try:
        totals, attempts, picked, finished = ray.get(tally.totals.remote(), timeout=10)
    except Exception:  # progress is a display: never the reason a run fails (a part's result comes with its task's)
        return
    info["attempts"] = attempts
    if progress is not None:
        progress.set(*totals)
    for shard, first, items in picked if checks is not None else ():
        checks.shard(shard, first, items)
    for part in finished:
        ended(*part)


def _failure(ray, exc: Exception, shard: Shard, attempts: int, output_prefix: str) -> ShardFailed:
    if isinstance(exc, ray.exceptions.RayTaskError):  # the task raised
        cause = exc.cause
        text = describe(cause)
    else:  # its process or node died on every attempt, or Ray itself failed
        cause = exc
        lines = str(exc).strip().splitlines()
        text = f"{type(exc).__name__}: {lines[0] if lines else 'no message'}"
    if attempts > 1:
        text += f" (on attempt {attempts})"
    kind = ShardInputError if isinstance(cause, ValueError) else ShardFailed
    return kind(f"part {shard} of {output_prefix} failed: {text}; no output was written", shard, cause)


def _check_not_empty(output_prefix: str, manifests: list[Manifest]) -> None:
    """As a local run: refuse to write a dataset of no document (a shard alone may be empty)."""
    if sum(m.documents for m in manifests):
        return
    by_reason: dict[str, int] = {}
    for m in manifests:
        for reason, n in m.rejects.get("by_reason", {}).items():
            by_reason[reason] = by_reason.get(reason, 0) + n
    count = sum(by_reason.values())
    why = (f"all {count:,} records were rejected, by reason {dict(sorted(by_reason.items()))}" if count
           else "the input holds no records")
    raise EmptyOutput(f"{output_prefix}: nothing to write ({why}); no output was written")


class _Heads:
    """The parts' .bin bytes joined in part order while later parts still run, into a `merge.Head` per output
    prefix and channel (PREFIX.shards/joined/N.C.bin) that the merges take as their output's start: the tasks write
    each part's bytes there themselves (`_Placing`), and a part is recorded as held once it and every part before it
    are there; a part an earlier run left (reused) is copied in by the head. Each part's other files are read as it
    ends, as the merges read them (`reads`, `read_ahead`)."""

    def __init__(self, directory: str, suffixes: list[str]) -> None:
        self.directory, self.suffixes = directory, suffixes
        self.prefixes: list[str] = []  # each part's -o
        self.reused: set[int] = set()  # the parts an earlier run left: copied in here
        self.heads: dict[str, list[Head]] = {}  # by suffix: a Head a channel
        self.next = 0  # the first part not handed yet
        self.reads = PartReads()

    def read_ahead(self, prefix: str) -> None:
        """The files of the part at -o `prefix` (of each output prefix) read as the merges read them."""
        for suffix in self.suffixes:
            self.reads.prepare(prefix + suffix)

    def restore(self) -> None:
        """The parts' .bin files an earlier run of this command put into its heads (none kept otherwise), put back
        from them for `kept.reuse` to check and reuse as any other part: those its tasks placed (K.placed, where they
        are, `_Placing`), and those it copied in (`merge.restore`)."""
        if not os.path.isdir(self.directory):
            return
        shards = os.path.dirname(self.directory)
        for name in sorted(os.listdir(shards)):
            if name.endswith(PLACED_SUFFIX):
                _restore_placed(os.path.join(shards, name))
        for name in sorted(os.listdir(self.directory)):
            if name.endswith(".bin"):
                restore(os.path.join(self.directory, name))

    def begin(self, prefixes: list[str], reused: set[int]) -> None:
        self.prefixes, self.reused = prefixes, reused
        shutil.rmtree(self.directory, ignore_errors=True)  # an earlier run's
        os.makedirs(self.directory)

    def sizes(self, results: dict[int, list[Manifest]]) -> dict[int, list[int]]:
        """The .bin sizes of the parts reused (checked against their manifests), in the heads' order (as
        `_Placing.made` tells a part's)."""
        return {k: [m.tokens * dtype.itemsize for m in results[k] for _, dtype in layout_of(m).channels("", m.dtype)]
                for k in self.reused}

    def ready(self, results: dict[int, list[Manifest]]) -> None:
        """The parts now ended in order after those handed before, handed (`results`: each ended part's
        manifests, in the order of the suffixes; a part run here ends once its bytes are in the heads)."""
        while self.next in results:
            for n, (suffix, manifest) in enumerate(zip(self.suffixes, results[self.next])):
                channels = layout_of(manifest).channels(self.prefixes[self.next] + suffix, manifest.dtype)
                if suffix not in self.heads:
                    self.heads[suffix] = [Head(os.path.join(self.directory, f"{n}.{c}.bin"), consume=True)
                                          for c in range(len(channels))]
                for head, (name, dtype) in zip(self.heads[suffix], channels):
                    head.add(name, None if self.next in self.reused else manifest.tokens * dtype.itemsize)
            self.next += 1

    def of(self, suffix: str) -> list[Head] | None:
        return self.heads.get(suffix)

    def close(self) -> None:
        """Every copy ended (a failed run's too, before its files are removed), then every removal of a part
        copied (`merge.Head.settle`); this node's folder of the tasks' parts removed (`_Placing`: they are done)."""
        shutil.rmtree(staging(os.path.dirname(self.directory)), ignore_errors=True)
        heads = [head for channels in self.heads.values() for head in channels]
        for head in heads:
            with contextlib.suppress(Exception):  # (a copy's failure: the run's own error says more)
                head.close()
        for head in heads:
            with contextlib.suppress(Exception):
                head.settle()


def _merge(configs: list, suffixes: list[str], final: list[str], outputs: AtomicOutputs, config,
           start: float, checks: "_DriverChecks | None", heads: _Heads) -> list[Manifest]:
    """Each output prefix merged from its shards under PREFIX.shards/merged/, then all committed at once
    with the certificate of `checks` (CertificateError at a mismatch: nothing is committed)."""
    from .merge import merge

    staging_dir = os.path.join(config.output_prefix + SHARDS_SUFFIX, STAGING)
    staging = os.path.join(staging_dir, "out")
    manifests = []
    for suffix in suffixes:
        merged = merge([c.output_prefix + suffix for c in configs], staging + suffix, quiet=config.quiet,
                       heads=heads.of(suffix), reads=heads.reads)
        merged.wall_seconds = round(time.monotonic() - start, 3)
        manifests.append(merged)
    for root, _, names in os.walk(staging_dir):
        for name in names:
            path = os.path.join(root, name)
            target = config.output_prefix + path[len(staging):]
            if target.endswith(".json") and target[:-5] in final or target.endswith(".rejects.jsonl"):
                continue  # manifests are written below, with the whole run's time; rejects are joined below
            os.replace(path, outputs.tmp(target))
    # One rejects file per run, as a local run (with several text keys, not one per prefix).
    if _join([c.rejects_path for c in configs], outputs.tmp(config.rejects_path)) == 0:
        outputs.discard(config.rejects_path)
    for prefix, manifest in zip(final, manifests):
        manifest.certificate = (pipeline.UNCERTIFIED if checks is None else
                                checks.certificate(manifest.certificate, manifest.fingerprint))
        manifest.write(outputs.tmp(prefix + ".json"))
    outputs.commit(markers=[p + ".json" for p in final])
    return manifests


def _join(paths: list[str], out_path: str) -> int:
    """The files that exist, concatenated in order; the bytes written."""
    written = 0
    with open(out_path, "wb") as out:
        for path in paths:
            if os.path.exists(path):
                with open(path, "rb") as f:
                    shutil.copyfileobj(f, out)
                written += os.path.getsize(path)
    return written


class _DriverChecks:
    """The certificate of a run on Ray: the shards' picked records checked by the driver, in a
    process forked before Ray starts (Ray's threads must not be forked beside), which builds the
    step's checker and loads the reference libraries while the tasks run. Where this process joined
    Ray already (a test, a notebook), the checks run here instead."""

    def __init__(self, step: pipeline.Step, inputs: list[dict], sources: list) -> None:
        self.counts: dict = {}
        self.sent: dict[int, list[bytes]] = {}  # by shard: a digest of each record of it sent to be checked
        estimates = [estimated_records(s) for s in sources]
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            self.checks, self.side = _ready(step, inputs, estimates), None
        else:
            from .workers import SideProcess

            self.side = SideProcess(functools.partial(_check_for_driver, step, inputs, estimates))
            self.side.send(_READY)

    def shard(self, index: int, first: int, picked: list) -> None:
        """Records part `index` picked, from its `first` on: those its task reported as it ran (`_Reporter`),
        then all of them as it ended. Each is checked once: one sent before (by this attempt, or by one
        that died) is only compared with what was sent, and a record that differs from it stops the run (a
        part's work is deterministic: its result must be what was checked)."""
        sent = self.sent.setdefault(index, [])
        new = []
        for k, record in enumerate(picked, start=first):
            digest = hashlib.blake2b(pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)).digest()
            if k < len(sent):
                if sent[k] != digest:
                    raise CertificateError(f"{record[0]}: part {index} picked this record again, unlike the "
                                           "first time (its task did not repeat its work exactly)")
            elif k == len(sent):
                sent.append(digest)
                new.append(record)
            else:  # (a report lost before: its records come with the shard's result)
                break
        self.add(new)

    def add(self, picked: list) -> None:
        """Picked records, as a task hands them (`Certifier.keeping`): CertificateError at a mismatch."""
        if not picked:
            return
        picked = [(where, item) for where, item, _ in picked]  # (as `Certifier.add` takes them)
        if self.side is None:
            take(self.counts, self.checks.check(picked))
        else:
            self.side.send(picked)
            for answer in self.side.arrived():
                take(self.counts, answer)

    def certificate(self, merged: dict | None, fingerprint: str) -> dict:
        """A merged prefix's certificate, once every check is in (`merged`: what the merge made of its
        shards' certificates, which counted the records they spelled); CertificateError at a mismatch."""
        if self.side is not None:  # its last answer is its checker, which writes the certificate here
            self.side.send(_DONE)
            *answers, self.checks = self.side.answers()
            for answer in answers:
                take(self.counts, answer)
            self.side.end(kill=False)
            self.side = None
        counts = {**self.counts, "records_spelled": (merged or {}).get("records_spelled", 0)}
        return self.checks.certificate(counts, (merged or {}).get("records_kept", 0), fingerprint)

    def end(self) -> None:
        if self.side is not None:
            self.side.end(kill=True)
            self.side = None


_READY, _DONE = "ready", "done"


def _ready(step: pipeline.Step, inputs: list[dict], estimates: list):
    """The checker of `step`, as a run's checks need it: prepared, the reference loaded."""
    step.prepare()
    checks = checks_for(step, inputs, estimates)
    if not checks.uncertified:
        checks.load()
    return checks


def _check_for_driver(step: pipeline.Step, inputs: list[dict], estimates: list, item):
    """In the driver's checking process: `_ready` first, then checks."""
    global _CHECKS
    if item == _READY:
        _CHECKS = _ready(step, inputs, estimates)
        return {}, None
    if item == _DONE:
        return _CHECKS
    return _CHECKS.check(item)


_CHECKS = None  # the driver's checking process's checker


# -- in the tasks ----------------------------------------------------------------------------------
def _shard_task(step_type, parts: dict, cwd: str, tally, task: int, first: tuple[int, str], pieces: dict[str, list],
                before: dict[int, tuple[str, int]]) -> tuple[list[tuple], list[int]]:
    """Shard `task`, in a Ray worker: its first part (`first`: the part and the folder of marks, `_first_part`),
    then the next part not taken (`Tally.next`), until none is left, each a step
    built from its config (`parts`, by index) and run in the driver's directory (relative paths mean there what
    they mean to the driver), with a progress that reports to the tally actor, and told to the tally as it
    ends; `pieces` and `before`: where the newlines before a part's first line are counted (`_newline_counts`).
    Each part is made in a folder of this node's (`_Placing`), its files but its .bin moved to PREFIX.shards/, and
    its .bin bytes written into the heads where the tally says once it can say (every part before it ended).
    → Of each part it ran: (its index, its manifests, the records it picked for the certificate
    (`pipeline.Step.check` items), (when its code began and ended (time.time), the CPU seconds it took, and for
    the task's first part when the task began and when the tally first answered it, else None)); and the parts
    it placed."""
    import ray

    entered = time.time()
    try:
        os.chdir(cwd)
    except OSError as exc:  # not retried: another attempt on this node would not find it either
        raise RuntimeError(f"{cwd}: the driver's working directory is not there on this node ({exc.strerror}): "
                           "run from a directory on a file system every node sees") from None
    attempt, handed = _first_part(ray, tally, task, *first)
    started = time.time()
    out, counted = [], {}  # (`_numbered`)
    placing = _Placing(os.path.dirname(next(iter(parts.values())).output_prefix))
    try:
        while handed is not None:
            index, part_attempt = handed
            began, cpu = time.time(), time.process_time()
            config = _numbered(ray, parts[index], before.get(index), pieces, counted)
            step = step_type(dataclasses.replace(config, output_prefix=placing.prefix(index)))
            manifests = pipeline.run(step, _Reporter(tally, index, part_attempt, step))
            sizes = placing.made(index, step, manifests)
            times = (began, time.time(), time.process_time() - cpu, None if out else (entered, started))
            out.append((index, manifests, getattr(step, "picked", []), times))
            # One call to the tally a part: the part made told with its sizes, the next asked for, and where the
            # bytes of those not placed go, as far as known (the driver takes a part's end once it is placed, when
            # it next asks); the reports before it, sent without waiting, are taken first (an actor runs one
            # caller's calls in order).
            handed, offsets = ray.get(tally.next.remote(task, attempt, out[-1], sizes), timeout=60)
            placing.place(offsets, tally, task, attempt)
        placing.finish(ray, tally, task, attempt)
        return out
    finally:
        placing.close()


def _numbered(ray, config, before: tuple[str, int] | None, pieces: dict[str, list], counted: dict):
    """A part's `config`, given the newlines before its first line where it starts inside a jsonl file (`before`: its
    file, how many of the file's pieces lie before it; `counted`: per file, [the counting tasks fetched, their pieces'
    counts], as parts come in order)."""
    if before is None:
        return config
    path, n = before
    fetched, known = counted.setdefault(path, [0, []])
    while len(known) < n:
        known += ray.get(pieces[path][fetched][0])
        fetched = counted[path][0] = fetched + 1
    return dataclasses.replace(config, shard=dataclasses.replace(config.shard, newlines_before=sum(known[:n])))


class _Placing:
    """In a task: where its parts are made, a folder of this node's (`staging`: memory where it has room), and
    their .bin bytes put into the heads (PREFIX.shards/joined/N.C.bin, `_Heads`) at the offsets the tally hands
    out, once every part before has ended. Each byte is so written once into the output's file system, and the
    driver copies none (the parts' .bin files, written there and joined by the driver, went through its page
    cache twice and made a 16 GB run wait on the kernel's writeback: bench/results/cpu/2026-12-03g)."""

    def __init__(self, shards: str) -> None:
        self.shards, self.heads = shards, os.path.join(shards, HEADS)
        root = staging(shards)
        self.folder = os.path.join(root, str(os.getpid()))
        _clear_dead(root)
        shutil.rmtree(self.folder, ignore_errors=True)
        os.makedirs(self.folder)
        self.pending: dict[int, list[tuple[str, int, str]]] = {}  # by part: (its staged .bin, size, its head)

    def prefix(self, index: int) -> str:
        return os.path.join(self.folder, str(index))

    def made(self, index: int, step, manifests: list[Manifest]) -> list[int]:
        """Part `index`, made: its files but its .bin moved to PREFIX.shards/; → its .bin sizes, in the heads'
        order."""
        staged = self.prefix(index)
        bins = _bins(staged, [p[len(staged):] for p in step.prefixes()], manifests)
        for entry in os.listdir(self.folder):
            path = os.path.join(self.folder, entry)
            if re.match(re.escape(str(index)) + r"[._]", entry) and path not in bins:
                _move(path, os.path.join(self.shards, entry))
        sizes = [os.path.getsize(path) for path in bins]
        self.pending[index] = [(path, size, os.path.join(self.heads, name))
                               for path, size, name in zip(bins, sizes, _head_names(manifests))]
        return sizes

    def place(self, offsets: dict[int, list[int]], tally, task: int, attempt: int) -> None:
        """The parts whose `offsets` (where their bytes start in each head) are given, placed there, each then
        marked (K.placed: what a run that resumes puts back, `_Heads.restore`) and told to the tally (not waited
        for: the calls after it are taken after it)."""
        done = []
        for part in sorted(set(offsets) & set(self.pending)):
            where = []
            for (path, size, head), offset in zip(self.pending.pop(part), offsets[part]):
                source = os.open(path, os.O_RDONLY)
                try:
                    target = os.open(head, os.O_WRONLY | os.O_CREAT, 0o666)
                    try:
                        copied = _copy_bytes(source, target, size, 0, offset)
                    finally:
                        os.close(target)  # (a shared file system sends what was written at close)
                finally:
                    os.close(source)
                if copied < size:
                    raise OSError(f"{path}: {copied:,} bytes of {size:,} placed")
                os.remove(path)
                where.append([os.path.basename(path), os.path.basename(head), offset, size])
            with atomic_file(os.path.join(self.shards, f"{part}{PLACED_SUFFIX}")) as f:
                json.dump(where, f)
            done.append(part)
        if done:
            tally.tell_placed.remote(task, attempt, done)

    def finish(self, ray, tally, task: int, attempt: int) -> None:
        """Every part left placed, as the parts before it end in other tasks."""
        deadline = time.monotonic() + PLACE_WAIT_SECONDS
        while self.pending:
            if time.monotonic() > deadline:
                raise RuntimeError(f"parts {sorted(self.pending)}: the parts before them did not end in "
                                   f"{PLACE_WAIT_SECONDS:.0f} s, so their bytes could not be placed")
            self.place(ray.get(tally.offsets.remote(task, attempt), timeout=60), tally, task, attempt)
            if self.pending:
                time.sleep(PLACE_POLL_SECONDS)

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _restore_placed(marker: str) -> None:
    """The .bin files of the part a K.placed `marker` describes, where they are gone, copied back out of the heads
    (a file the heads lack, or too short, is left out: the part is then made again)."""
    shards = os.path.dirname(marker)
    try:
        with open(marker, encoding="utf-8") as f:
            where = json.load(f)
        for name, head, offset, size in where:
            path = os.path.join(shards, os.path.basename(name))
            if os.path.exists(path):
                continue
            source = os.open(os.path.join(shards, HEADS, os.path.basename(head)), os.O_RDONLY)
            try:
                with atomic_file(path, "wb") as out:
                    if _copy_bytes(source, out.fileno(), int(size), int(offset), 0) < int(size):
                        raise OSError(f"{head} ends before part {marker}'s bytes")
            finally:
                os.close(source)
    except (OSError, ValueError, TypeError):
        pass


def staging(shards: str) -> str:
    """This node's folder for the parts of the run at PREFIX.shards/ `shards` being made: in memory (/dev/shm) where
    it has STAGING_ROOM free, else in the temp folder."""
    name = "qwen-data-" + hashlib.sha256(os.path.abspath(shards).encode()).hexdigest()[:16]
    try:
        found = os.statvfs(MEMORY)
        if found.f_bavail * found.f_frsize >= STAGING_ROOM and os.access(MEMORY, os.W_OK):
            return os.path.join(MEMORY, name)
    except OSError:
        pass
    return os.path.join(tempfile.gettempdir(), name)


def _clear_dead(root: str) -> None:
    """The folders under `root` of tasks whose process is gone (killed), removed."""
    with contextlib.suppress(FileNotFoundError):
        for entry in os.listdir(root):
            try:
                os.kill(int(entry), 0)
            except ProcessLookupError:
                shutil.rmtree(os.path.join(root, entry), ignore_errors=True)
            except (ValueError, PermissionError):  # (not a task's; or a live process of another user)
                pass


def _move(source: str, target: str) -> None:
    """`source` moved to `target`, whole or not at all, across file systems too."""
    try:
        os.replace(source, target)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        shutil.copyfile(source, target + ".moving")
        os.replace(target + ".moving", target)
        os.remove(source)


def _bins(prefix: str, suffixes: list[str], manifests: list[Manifest]) -> list[str]:
    """The .bin files of the part at -o `prefix`, in the order of the heads they go into (`_head_names`)."""
    return [name + ".bin" for suffix, m in zip(suffixes, manifests)
            for name, _ in layout_of(m).channels(prefix + suffix, m.dtype)]


def _head_names(manifests: list[Manifest]) -> list[str]:
    """The heads' files: N.C.bin, for output prefix N (a text key's) and channel C (ids, loss mask)."""
    return [f"{n}.{c}.bin" for n, m in enumerate(manifests) for c in range(len(layout_of(m).channels("", m.dtype)))]


def _first_part(ray, tally, task: int, part: int, marks: str) -> tuple[int, tuple[int, int] | None]:
    """(this attempt of task `task`, the part it runs first and that part's attempt). Its first attempt runs
    `part`, which the tally holds for it from the start, without asking: the tally's process starts beside the
    tasks', and they waited for its first answer (a median 0.20-0.43 s a run after their code began, on 16-core
    hosts' fresh clusters: `bench/results/cpu/2026-12-02c`).
    An attempt finding the mark (`marks`/task) of one before it is a retry: it asks the tally, which puts back
    the parts the attempt before held."""
    try:
        os.close(os.open(os.path.join(marks, str(task)), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return 1, (part, 1)
    except FileExistsError:
        attempt = ray.get(tally.start.remote(task), timeout=60)
        return attempt, ray.get(tally.next.remote(task, attempt, None), timeout=60)[0]


class _Reporter:
    """The progress object a task hands to `pipeline.run`: sends its part's totals to the tally, at most
    every POLL_SECONDS and once at the end, never waiting (each round trip cost a part ~2 ms, four a part)."""

    def __init__(self, tally, shard: int, attempt: int | None, step) -> None:
        self.tally, self.shard, self.attempt, self.step = tally, shard, attempt, step
        self.counts = [0, 0, 0, 0]  # records, text bytes, tokens, input bytes
        self.sent = 0  # the picked records reported
        self._next = time.monotonic() + POLL_SECONDS

    def update(self, records: int, text_bytes: int, tokens: int, input_bytes: int = 0) -> None:
        for i, n in enumerate((records, text_bytes, tokens, input_bytes)):
            self.counts[i] += n
        now = time.monotonic()
        if now >= self._next:
            self._next = now + POLL_SECONDS
            self._send()

    def close(self) -> None:
        self._send()  # (the final totals: taken before the part's end, which the task tells next)

    def _send(self) -> None:
        if self.attempt is None:
            return
        picked = getattr(self.step, "picked", None) or []  # (`Certifier.keeping`; none: --no-certify)
        try:
            self.tally.report.remote(self.shard, self.attempt, tuple(self.counts), self.sent, picked[self.sent:])
            self.sent = len(picked)
        except Exception:  # progress is a display: never the reason a task fails
            self.attempt = None
