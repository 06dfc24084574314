"""A run's journal: the chunks it has written, so that a run killed at any point and run again with
the same command goes on from where it was, and ends with the bytes of an uninterrupted run.

PREFIX.journal lies beside the staged files (`AtomicOutputs`: FILE.tmp, and the index writer's side
files). Its first line names the run (`identity`: everything that decides the output's bytes, never
--workers); then one line per chunk written, in order, once its records picked for the certificate
have been checked: for each staged file, where the chunk's bytes end and their joinable hash
(`formats.digest`), with the chunk's counts and the certificate's. A run that finds a journal of the
same identity checks it before using it: each file's ranges hashed again, in threads, the files cut
back to the last chunk whose every range holds what the journal says; the chunks after it are done
again. Nothing in it is trusted unchecked: a journal of another run, damaged or cut short, or a file
shorter than it says, only means less work is reused. The commit removes it, and so does a run that
fails (only a killed or interrupted run leaves its staged files and journal behind).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from ..formats.digest import BinDigest, file_digest, is_joinable, join, sha256_of
from ..formats.outputs import TMP_SUFFIX, finish_commit

SUFFIX = ".journal"
HASH_BYTES = 1 << 22  # read back and hashed at a time, checking a journal
# What a chunk's line holds, in the run's identity: a journal whose lines hold less (2: SFT's trained tokens) is
# another run's, whose work is done again.
LINES = 2


def identity(config, inputs: list[dict]) -> str:
    """What decides a run's output bytes: its settings but the workers, progress and the certificate's
    process choices, and the pins of its inputs (`manifest.input_entry`); hashed."""
    settings = {k: v for k, v in sorted(vars(config).items()) if k not in ("workers", "quiet", "check_here")}
    text = json.dumps({"settings": settings, "inputs": inputs, "lines": LINES}, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Resumed:
    """What a journal let a run reuse: its first `chunks` chunks, each as the journal recorded it, and
    the certificate's counts of those whose picked records were checked (by the chunk's number)."""

    chunks: list[dict] = field(default_factory=list)
    answers: dict[int, dict] = field(default_factory=dict)

    @property
    def ends(self) -> dict[str, int]:
        """Where each staged file ends after the chunks reused."""
        return dict(self.chunks[-1]["files"]) if self.chunks else {}

    def digests(self, path: str) -> list[str]:
        """The joinable hashes of `path`'s ranges, chunk after chunk."""
        return [chunk["hashes"][path] for chunk in self.chunks]

    def total(self, name: str) -> int:
        return sum(chunk[name] for chunk in self.chunks)


class Journal:
    def __init__(self, prefix: str, run: str) -> None:
        self.path, self.run = prefix + SUFFIX, run
        self.chunks = 0  # chunk lines written
        self._awaited: dict[int, int] = {}  # the certifier's batch of a chunk's picked records → the chunk
        self._file = None
        self._ends: dict[str, int] = {}

    def resumable(self, files: list[str], read_picked=None) -> Resumed:
        """The chunks of an earlier run of this identity whose bytes in `files` (staged paths) are
        still what the journal says, each file cut back to the last of them; none where there is no
        such run (the files are then written anew). `read_picked`: reads a picked record back
        (`item_from_json`); a chunk whose picked records were not kept or do not read back is reused
        only where its check is in the journal."""
        chunks, answers = _read(self.path, self.run)
        if not chunks or not all(os.path.exists(f) for f in files):
            return Resumed()
        good = _checked(chunks, files)
        good = next((k for k, chunk in enumerate(chunks[:good])
                     if k not in answers and not _reads_back(chunk["picked"], read_picked)), good)
        resumed = Resumed(chunks[:good], {k: a for k, a in answers.items() if k < good})
        for path in files:
            os.truncate(path, resumed.ends.get(path, 0))
        return resumed

    def start(self, resumed: Resumed) -> None:
        """Write the journal anew: this run's identity, then the chunks reused."""
        self._file = open(self.path, "w", encoding="utf-8")
        self._file.write(json.dumps({"run": self.run}) + "\n")
        for chunk in resumed.chunks:
            self._file.write(json.dumps(chunk) + "\n")
        for k, checked in resumed.answers.items():
            self._file.write(json.dumps({"answered": k, "checked": checked}) + "\n")
        self._file.flush()
        self._ends = resumed.ends
        self.chunks = len(resumed.chunks)

    def written(self, files: dict[str, str | None], known: dict[str, int] | None = None) -> dict:
        """Where each staged file ends now a chunk is written, and the joinable hash of the bytes it
        added (`files`: path → that hash, or None: read back here, from the page cache); `known`:
        where some of them end, as taken when the chunk was written (the file may have grown since)."""
        ends, hashes = {}, {}
        for path, digest in files.items():
            ends[path] = end = known[path] if known and path in known else os.path.getsize(path)
            start = self._ends.get(path, 0)
            hashes[path] = digest if digest is not None else _range_digest(path, start, end - start)
        self._ends = ends
        return {"files": ends, "hashes": hashes}

    def chunk(self, entry: dict, batch: int | None = None, picked: str | None = None) -> None:
        """A chunk's line (`written`'s, with its counts), numbered in turn; `picked`: its picked
        records as JSON text, made by the worker (`pipeline.picked_json`; None: not kept), put in
        the line as it is; `batch`: the certifier's number of them (`answers`)."""
        text = json.dumps(entry)
        self._text(f'{text[:-1]}, "picked": {picked if picked is not None else "null"}}}')
        if batch is not None:
            self.awaiting(batch, self.chunks)
        self.chunks += 1

    def awaiting(self, batch: int, chunk: int) -> None:
        """Chunk `chunk`'s picked records are the certifier's batch `batch`, not answered yet."""
        self._awaited[batch] = chunk

    def answers(self, answered: dict[int, dict]) -> None:
        """The certificate's counts of each chunk whose batch is now `answered`, one line each."""
        for batch in [b for b in self._awaited if b in answered]:
            self._line({"answered": self._awaited.pop(batch), "checked": answered[batch]})

    def _line(self, value: dict) -> None:
        self._text(json.dumps(value))

    def _text(self, line: str) -> None:
        self._file.write(line + "\n")
        self._file.flush()  # in the page cache: a killed process's writes outlive it

    def committing(self, renamed: list[str], removed: list[str], bins: dict[str, str]) -> None:
        """The commit about to begin (`AtomicOutputs.commit_order`), with the hash of each file it renames:
        a .bin's joinable hash (`bins`, from its manifest), every other file's sha256 (read here: an
        index, a manifest, the rejects). A run killed during it finishes it (`finish_commit`)."""
        hashes = {path: bins.get(path) or sha256_of(path + TMP_SUFFIX) for path in renamed}
        self._line({"commit": {"renamed": renamed, "removed": removed, "hashes": hashes}})

    def finish_commit(self) -> list[str] | None:
        """Where this run's journal says its commit began and every file it renames holds the bytes
        it hashed (renamed or not yet), the commit finished; → the files renamed. None otherwise."""
        if not os.path.exists(self.path):
            return None
        with open(self.path, encoding="utf-8") as f:
            try:
                lines = [json.loads(line) for line in f]
            except ValueError:
                return None
        if not lines or lines[0].get("run") != self.run or "commit" not in lines[-1]:
            return None
        commit = lines[-1]["commit"]
        for path in commit["renamed"]:
            where = path + TMP_SUFFIX if os.path.exists(path + TMP_SUFFIX) else path
            if not os.path.exists(where):
                return None
            found = file_digest(where) if is_joinable(commit["hashes"][path]) else sha256_of(where)
            if found != commit["hashes"][path]:
                return None
        finish_commit(commit["renamed"], commit["removed"])
        self.remove()
        return commit["renamed"]

    def close(self) -> None:
        """Left for the next run (an interrupted one)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def remove(self) -> None:
        self.close()
        if os.path.exists(self.path):
            os.remove(self.path)


class Placed:
    """A writer's chunks in order, whose bytes the workers that made them may still be writing
    (`workers.Placement`): what waits on a chunk (`Writer.behind`: its journal line) runs once it and
    every chunk before it are in the files, with `current` that chunk (its ends and its digests)."""

    def __init__(self) -> None:
        self._unwritten: deque[_Added] = deque()
        self.current: _Added | None = None

    def add(self, placement, batches: list[tuple], digests) -> None:
        """One chunk: `batches`, each (an `IndexedDatasetWriter` hashed "given", tokens, sequence
        lengths, their joinable hash), placed in their writers (`place`). Where `placement` (the
        chunk came from a worker's slot) and a batch's tokens are the bytes its file holds, that
        worker writes them; the others are written here. `digests`: what `current` gives back."""
        targets, ends = [], {}
        for writer, tokens, lengths, digest in batches:
            data, offset = writer.place(tokens, lengths, digest)
            if placement is not None and data is tokens:
                targets.append((writer.bin_path, tokens, offset))
            else:
                writer.write_at(data, offset)
            lengths_file, ends_file = writer.files(writer.bin_path, writer.idx_path)[1:]
            # (taken now: later chunks' bytes may be in the files by the time its line is written)
            ends |= {writer.bin_path: offset + data.nbytes, lengths_file: writer.sequences * 4,
                     ends_file: writer.documents * 8}
        if targets:
            placement.write(targets)
            placement.then = self.run_written  # (its journal line then follows its bytes at once)
        self._unwritten.append(_Added(placement if targets else None, ends, digests, []))

    def behind(self, call) -> None:
        """`call()` once the last chunk added is in the files, and every one before it."""
        if not self._unwritten:  # (they are: it runs as things stand)
            call()
            return
        self._unwritten[-1].calls.append(call)
        self.run_written()

    def run_written(self) -> None:
        """The calls waiting on chunks now written, in order."""
        while self._unwritten and (self._unwritten[0].placement is None or self._unwritten[0].placement.done):
            self.current = chunk = self._unwritten.popleft()
            for call in chunk.calls:
                call()

    def settle(self) -> None:
        """The calls of the chunks the workers had written (an interrupted run: the others are done
        again); errors not wanted (a failed run's staged files are gone)."""
        try:
            self.run_written()
        except OSError:
            pass

    def close(self) -> None:
        """Every chunk written (the map waited for its workers' writes) and its calls run."""
        self.run_written()
        if self._unwritten:
            raise RuntimeError("a chunk's bytes were not written by its worker")


class _Added(NamedTuple):
    """A chunk added to a `Placed`."""

    placement: object  # `workers.Placement` of the worker writing its bytes, None: written here
    ends: dict[str, int]  # where each staged file ends after it
    digests: object  # its bytes' joinable hashes, as the writer gave them
    calls: list  # waiting for it to be written (`behind`)


def _read(path: str, run: str) -> tuple[list[dict], dict[int, dict]]:
    """The chunk lines of the journal at `path` if it is `run`'s, up to the first line cut short, and
    its answers by chunk."""
    chunks: list[dict] = []
    answers: dict[int, dict] = {}
    if not os.path.exists(path):
        return chunks, answers
    with open(path, encoding="utf-8") as f:
        try:
            if json.loads(f.readline()).get("run") != run:
                return chunks, answers
            for line in f:
                value = json.loads(line)
                if "answered" in value:
                    answers[value["answered"]] = value["checked"]
                elif "files" in value and "hashes" in value:
                    if value.get("picked") and "picked_at" not in value:
                        value["picked"] = None  # kept as an earlier build kept them: not read back
                    chunks.append(value)
        except (ValueError, AttributeError, KeyError, TypeError):  # a line cut short by the kill, or no journal of ours
            pass
    return chunks, answers


def _reads_back(picked: list | None, read) -> bool:
    """Whether a chunk's picked records were kept and read back (a journal of another version may
    keep them otherwise: its chunk is then done again, never a failure)."""
    if picked is None:
        return False
    try:
        for _, item in picked if read is not None else []:
            read(item)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return False
    return True


def _checked(chunks: list[dict], files: list[str]) -> int:
    """How many of `chunks`, from the first, have every file's range hold the bytes they hashed."""
    from concurrent.futures import ThreadPoolExecutor  # (a run that resumes nothing never needs it)

    ranges = []
    for k, chunk in enumerate(chunks):
        if set(chunk["files"]) != set(files):
            return k
        before = chunks[k - 1]["files"] if k else {}
        ranges += [(k, path, before.get(path, 0), chunk["files"][path] - before.get(path, 0), chunk["hashes"][path])
                   for path in files]
    with ThreadPoolExecutor(min(len(ranges), os.cpu_count() or 1) or 1) as pool:
        held = list(pool.map(lambda r: r[3] >= 0 and _range_digest(r[1], r[2], r[3]) == r[4], ranges))
    bad = [k for (k, *_), ok in zip(ranges, held) if not ok]
    return min(bad) if bad else len(chunks)


def _range_digest(path: str, offset: int, size: int) -> str | None:
    """The joinable hash of `size` bytes of `path` from `offset`; None where the file is shorter."""
    digest, end = BinDigest(), offset + size
    with open(path, "rb", buffering=0) as f:
        while offset < end:
            block = os.pread(f.fileno(), min(end - offset, HASH_BYTES), offset)
            if not block:
                return None
            digest.update(block)
            offset += len(block)
    return digest.hexdigest()


def joined(resumed: Resumed, path: str) -> str:
    """The joinable hash of `path`'s bytes the chunks reused wrote."""
    return join(resumed.digests(path))
