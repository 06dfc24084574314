"""A Ray run's finished parts (`run.ray`: its shards, Ray tasks, take them in turn; each as `--shard K/N` cuts the
inputs), kept under PREFIX.shards/ for the same command to reuse (the executor's docstring says when they are kept
and what checks them). Nothing kept is trusted: a part is reused only where run.json names this run, its files
hash to its manifests, and the records it picked for the certificate, saved beside it (K.picked), are the ones
saved with those manifests and read back from its files; the driver then checks them against the reference
again. (`config.shard` here is a part's.)"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pickle
import re
import shutil
import sys

from ..certify.checks import checks_for, read_back
from ..errors import describe
from ..formats.digest import sha256_of
from ..formats.integrity import check_prefixes
from ..formats.manifest import Manifest
from ..formats.outputs import atomic_file
from ..inputs.readers import estimated_records
from ..inputs.records import EmptyOutput, TooManyRejects
from ..text.tokenizer import IDS_IDENTITY

RUN_FILE = "run.json"  # PREFIX.shards/run.json: the run whose parts lie there, their count and its shards'
PICKED_SUFFIX = ".picked"  # PREFIX.shards/K.picked: what reusing part K needs besides its files
# A run's failures that are its data's (bad input, a certificate mismatch, a merge refused, too many
# rejects, nothing to write): the same command would fail alike, so its shards are not kept.
DATA_FAILURES = (ValueError, TooManyRejects, EmptyOutput)


@dataclasses.dataclass
class Kept:
    """PREFIX.shards/ across runs: the run it holds the shards of, and what checks them for a run that resumes."""

    directory: str
    run: str  # this run's identity (`journal.identity`): its settings but the shard count, its inputs' pins
    inputs: list[dict]  # their pins (`pipeline.input_list`), for the checker reading picked records back
    # (shards, parts) run.json records for this run (`run.ray`: its tasks, and the parts they take); None:
    # nothing there is reused
    recorded: tuple[int, int] | None = None


def recorded(directory: str, run: str, shards: int | None) -> tuple[int, int] | None:
    """(shards, parts) `directory`/run.json records, where it is run `run`'s (and has `shards`, if given);
    None otherwise."""
    try:
        with open(os.path.join(directory, RUN_FILE), encoding="utf-8") as f:
            found = json.load(f)
        counts = found["shards"], found["parts"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if found.get("run") != run or any(type(n) is not int or n < 1 for n in counts) or shards not in (None, counts[0]):
        return None
    return counts


def record(kept: Kept, shards: int, parts: int) -> None:
    """run.json written: the parts there are this run's, `parts` of them taken by `shards` tasks."""
    os.makedirs(kept.directory, exist_ok=True)
    with atomic_file(os.path.join(kept.directory, RUN_FILE)) as f:
        json.dump({"run": kept.run, "shards": shards, "parts": parts}, f)


def left(exc: BaseException, directory: str, quiet: bool) -> None:
    """A failed or interrupted run's shards: removed where the data failed it (`DATA_FAILURES`, raised
    here or by a task), since a rerun would fail the same way; kept otherwise (interrupted, a task's
    process or node lost, Ray or the file system failing), for the same command to reuse."""
    if isinstance(exc, DATA_FAILURES) or isinstance(getattr(exc, "cause", None), DATA_FAILURES):
        shutil.rmtree(directory, ignore_errors=True)
    elif os.path.isdir(directory) and not quiet:
        print(f"ray: the finished shards stay under {directory}/: the same command reuses them", file=sys.stderr)


def keep_picked(config, manifests: list[Manifest], picked: list) -> None:
    """Beside a finished shard, once its result is in: the records it picked (as its task handed them),
    its manifests' fingerprints and its rejects file's sha256, for a run that reuses it (`_saved`)."""
    saved = {"fingerprints": [m.fingerprint for m in manifests], "rejects": _rejects_sha(config.rejects_path),
             "picked": picked}
    with atomic_file(config.output_prefix + PICKED_SUFFIX, "wb") as f:  # whole or not at all: a killed driver
        pickle.dump(saved, f, protocol=pickle.HIGHEST_PROTOCOL)


def _rejects_sha(path: str) -> str | None:
    return sha256_of(path) if os.path.exists(path) else None


class Redo(Exception):
    """Why a shard an earlier run left is not reused (`_reused`)."""


def reuse(step_type, configs: list, inputs: list[dict], sources: list, checks,
           quiet: bool) -> dict[int, list[Manifest]]:
    """The manifests of the shards of `configs` an earlier run of this command finished and that check
    out (`_reused`), by shard, their picked records handed to `checks`; every file of the others
    removed, for their tasks to write anew."""
    reader, reused = _Reader(step_type, configs[0], inputs, sources), {}
    for config in configs:
        try:
            found = _reused(step_type, config, reader)
        except Redo as why:
            found = None
            if not quiet:
                print(f"ray: part {config.shard.index} redone: {why}", file=sys.stderr)
        if found is None:
            _clear(config.output_prefix)
            continue
        reused[config.shard.index], picked = found
        if checks is not None:
            checks.add(picked)  # checked again, as if the shard had just ended
    if not quiet:
        print(f"ray: reusing {len(reused)} of {len(configs)} parts (checked)", file=sys.stderr)
    return reused


def _reused(step_type, config, reader: "_Reader") -> tuple[list[Manifest], list] | None:
    """A shard an earlier run finished: its manifests and picked records, once its files hash to what its
    manifests say (`formats.integrity`, as a trainer checks a prefix), its rejects file and manifests are
    those its picked records were saved with, and those records read back from its files; None where it
    never finished; Redo saying why where something does not check out."""
    prefixes = step_type(config).prefixes()
    picked_path = config.output_prefix + PICKED_SUFFIX
    if not any(os.path.exists(p) for p in [picked_path] + [prefix + ".json" for prefix in prefixes]):
        return None
    try:
        manifests = [Manifest.read(prefix) for prefix in prefixes]
        shard = config.shard.record()
        problem = next((f"{p}.json is not the manifest of shard {config.shard}"
                        for p, m in zip(prefixes, manifests) if m.shard != shard), None)
        problem = problem or next((c.problem for c in check_prefixes(list(zip(prefixes, manifests))) if c.problem),
                                  None)
    except (OSError, ValueError, KeyError, TypeError) as exc:  # a file missing, a manifest damaged
        raise Redo(describe(exc)) from None
    if problem:
        raise Redo(problem)
    picked = _saved(picked_path, manifests, config.rejects_path)
    reader.check(prefixes, manifests, picked)
    return manifests, picked


def _saved(path: str, manifests: list[Manifest], rejects_path: str) -> list:
    """The picked records `keep_picked` saved at `path`, where they were saved with these manifests and
    this rejects file; Redo otherwise."""
    try:  # (pickled as the tasks hand the records over; PREFIX.shards/ is this command's own working folder,
        # trusted as far as its staged files are: what the records say is then checked against the shard's bytes)
        with open(path, "rb") as f:
            saved = pickle.load(f)
        fingerprints, rejects, picked = saved["fingerprints"], saved["rejects"], saved["picked"]
    except FileNotFoundError:
        raise Redo(f"its picked records were not saved ({path} is missing: the run stopped before its result "
                    "came in)") from None
    except Exception as exc:  # damaged bytes unpickle into almost any error
        raise Redo(f"{path}: unreadable ({type(exc).__name__})") from None
    if fingerprints != [m.fingerprint for m in manifests]:
        raise Redo(f"{path}: saved with other data than the shard's manifests describe")
    if rejects != _rejects_sha(rejects_path):
        raise Redo(f"{rejects_path} is not the rejects file the shard wrote")
    return picked


class _Reader:
    """What checks a shard an earlier run left as its task checked itself: its tokenizer's files and flavour,
    and its picked records read back from its files (`certify.checks.read_back`, through the checker's
    `to_read_back`, as `pipeline` reads a run's back from its staged files). Made at the first shard
    checked: a shard's step is prepared for it (its tokenizer loaded: ~0.3 s)."""

    def __init__(self, step_type, config, inputs: list[dict], sources: list) -> None:
        self._made = functools.partial(_shard_checker, step_type, config, inputs, sources)
        self._checker = None

    def check(self, prefixes: list[str], manifests: list[Manifest], picked: list) -> None:
        """Redo unless the shard's manifests name this run's tokenizer and `picked` reads back from its files."""
        if self._checker is None:
            self._checker = self._made()
        checker = self._checker
        ours = checker.tokenizer.identity()
        if any(m.tokenizer.get(name) != ours[name] for m in manifests for name in IDS_IDENTITY):
            raise Redo(f"{prefixes[0]}.json names another tokenizer than this run's")
        try:
            # (a shard lays out no rows: its samples lie as `to_read_back` places them, `SFTWriter.placed`)
            entries = [entry for where, item, documents in picked
                       for entry in checker.to_read_back(where, item, documents)]
            read_back(entries, checker.staged_files(prefixes))
        except Exception as exc:  # a mismatch (CertificateError), or picked records not as saved
            raise Redo(f"its picked records do not read back from its files: {describe(exc)}") from None


def _shard_checker(step_type, config, inputs: list[dict], sources: list):
    step = step_type(config)
    step.prepare()
    return checks_for(step, inputs, [estimated_records(s) for s in sources])


def _clear(prefix: str) -> None:
    """Every file of the shard at `prefix` (PREFIX.shards/K: K.bin, K_KEY.idx, K.picked, their .tmp, .lock...)."""
    directory, name = os.path.split(prefix)
    for entry in os.listdir(directory):
        if re.match(re.escape(name) + r"[._]", entry):
            os.remove(os.path.join(directory, entry))
