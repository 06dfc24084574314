"""The reference's checks of a run's picked records (`certify.checks`), beside the run.

Workers pick records and hand over what they made of them (`ChunkResult.to_check`); the checker's
`check` encodes them again with the reference libraries and compares. Loading HF's tokenizer takes
~0.5 s: a process that has not loaded it checks in processes of their own (`early`), forked as the
run starts, which load it while the run prepares and works; one that holds it already (a second run
in the same process, as tests and Ray tasks make) checks here.

The run never waits for that process. Its answers are read as they come: left in the pipe until the
end, a few hundred of them filled it, and the process stopped checking until the workers were done
(a tail of seconds on a large run). The records picked while it loads wait here and go once it says
it is loaded: sent at once, they held back the start of every certified run on a 16-core host (the
workers ran 0.5-1 s later); kept here, the workers start as they do without the certificate.

Workers pickle a chunk's picked records in parts of PART_RECORDS, and a checking process holds
OUTSTANDING_RECORDS of them at most; the other parts wait here. Where one is still
behind once the workers are done (few cores: on 2, the 16 MB bench chats' checks ended the run alone
on one core for ~1 s), it forks helpers then, which share what it loaded and check a part of each
batch beside it on the cores the workers left (`checks.check_in_side`, "helpers").
"""

from __future__ import annotations

import os
from collections import deque

from ..certify.checks import READY, CertificateError, add_counts, check_in_side
from ..certify.reference import holds
from .prestart import take as take_prestarted

NOTHING_WRITTEN = "nothing was written (--no-certify writes it anyway, recorded as uncertified)"
PART_RECORDS = 32  # picked records a message to a checking process holds, at most
OUTSTANDING_RECORDS = 128  # records sent to a checking process and not answered yet, at most (~0.1 s of checks)
HELPER_RECORDS = 64  # records left to check for each helper forked at the end, at the least (a fork costs ~10-30 ms)
# helpers of a checking process, at most: each shares its memory, but summed RSS counts it again (~0.2 GB)
MOST_HELPERS = 3


class Certifier:
    def __init__(self, checks, sides: list | None = None) -> None:
        """`sides`: the checking processes `early` started (none: check here)."""
        self.checks = checks
        self.counts: dict = {}
        self.sides = sides or []
        self.kept: list | None = None
        self.waiting: deque[tuple] = deque()  # (what to send, its records, its batch): loading, or OUTSTANDING_RECORDS
        self.loading = bool(self.sides)
        # Each batch of items added gets a number, in order; the counts of those answered so far, by
        # number (`run.journal` writes a chunk once its batch is). A batch goes to the side with the
        # fewest records not answered yet: one that started later or checks slower gets fewer (at 16
        # workers the side forked as the command started, which imports and loads on the run's cores,
        # took 2.5 times the other's CPU and was the run's tail).
        self.added = 0
        self.answered: dict[int, dict] = {}
        self._parts: dict[int, list] = {}  # batch → [its parts not answered, their counts so far]
        self._queued: list[deque] = [deque() for _ in self.sides]  # per side: (batch, records) sent, not answered
        self._load = [0] * len(self.sides)  # per side: the records of those
        for side in self.sides:
            side.send(("checks", checks))

    @staticmethod
    def early(tokenizer_json: str, count: int = 1, whole: bool = True) -> list:
        """`count` checking processes, forked before the run prepares anything (or the one forked
        as the command started, `prestart`, adopted), that load HF's tokenizer from `tokenizer_json`
        at once (~0.4-0.8 s: the reference's fixed cost, which a small run would otherwise add to
        its own); none where this process holds it already (a
        second run in one process, as tests and Ray tasks make: it checks here). HF encodes ~1 MB/s
        a core: a run of many workers checks its sample in several processes, or its end would
        wait for one. `whole` false: they load the tables HF's tokenizer is cut down from
        (`certify.trimmed`), and the whole one only where the run's checks ask (pretraining)."""
        if holds(tokenizer_json):
            take_prestarted(None)  # one forked as the command started (`prestart`) is not needed
            return []
        from .workers import SideProcess

        forked = take_prestarted(tokenizer_json)
        sides = [SideProcess(check_in_side, forked)] if forked else []
        sides += [SideProcess(check_in_side) for _ in range(count - len(sides))]
        for side in sides:
            side.send(("load", tokenizer_json, whole))
        return sides

    @classmethod
    def keeping(cls, step) -> "Certifier":
        """One that checks nothing: the items go to `step.picked`, for the caller to check, each as
        (where, item, documents before its chunk's): a Ray driver reads them back from a shard's
        files when it reuses the shard (`run.ray`), and `to_read_back` needs where they lie."""
        certifier = cls(step.checks)
        certifier.kept = step.picked = []
        return certifier

    def add(self, items: list, documents: int = 0, pickled: tuple | None = None) -> int:
        """`items`: (where, what the worker made of a picked record), where being file:line; → the
        batch's number. CertificateError at the first mismatch known. `documents`: those written
        before the items' chunk (only `keeping` keeps them). `pickled`: (path, shift, the items'
        values pickled by the worker in parts, each with its count), where `where` is `path` and the value's
        number + shift: sent to a checking process as they are (`checks.check_in_side`)."""
        batch, self.added = self.added, self.added + 1
        if self.kept is not None:
            self.kept += [(where, item, documents) for where, item in items]
            return batch
        if not self.sides:
            self._parts[batch] = [1, {}]
            self._take(batch, self.checks.check(items))
            return batch
        if pickled:
            parts = [(("picked", pickled[0], pickled[1], part), size) for size, part in pickled[2]]
        else:
            parts = [(part, len(part)) for part in in_parts(items)]
        self.waiting += [(message, size, batch) for message, size in parts]
        self._parts[batch] = [len(parts), {}]
        for k, side in enumerate(self.sides):
            for answer in side.arrived():
                self._answer(k, answer)
        self._send_waiting()
        return batch

    def _answer(self, side: int, answer) -> None:
        """An answer of checking process `side`: the next batch it was sent (loads answer nothing)."""
        if answer is None:  # to "load": no batch
            return
        if answer == READY:  # to "checks", which load what the checks need: one side checks now
            self.loading = False
            return
        batch, records = self._queued[side].popleft()
        self._load[side] -= records
        self._take(batch, answer)

    def _take(self, batch: int, answer) -> None:
        """A part of `batch` answered: the batch is once all its parts are (`answered`, their counts summed)."""
        take(self.counts, answer)
        part = self._parts[batch]
        part[0] -= 1
        add_counts(part[1], answer[0])
        if not part[0]:
            self.answered[batch] = self._parts.pop(batch)[1]

    def finish(self) -> dict:
        """The summed counts of every check; CertificateError at the first mismatch. The workers are
        done: a checking process still behind gets helpers for what is left (`helpers`)."""
        for side, count in zip(self.sides, self.helpers(len(os.sched_getaffinity(0)))):
            if count:
                side.send(("helpers", count))
        while self.waiting or any(self._queued):
            self._send_waiting(loaded=True)
            for k, side in enumerate(self.sides):
                if self._queued[k]:
                    self._answer(k, side.answer())
        for k, side in enumerate(self.sides):
            for answer in side.answers():  # what is left: answers to load, checks and helpers
                self._answer(k, answer)
            side.end(kill=False)
        self.sides = []
        return self.counts

    def helpers(self, cores: int) -> list[int]:
        """Helpers for each checking process once the workers are done, on `cores`: the cores the
        checking processes leave, shared among them, one for each HELPER_RECORDS records left, MOST_HELPERS
        at most."""
        sides = len(self.sides)
        if not sides:
            return []
        left = sum(records for _, records, _ in self.waiting) + sum(self._load)
        return [max(0, min((cores - sides) // sides, left // HELPER_RECORDS // sides, MOST_HELPERS))] * sides

    def end(self) -> None:
        for side in self.sides:
            side.end(kill=True)

    def _send_waiting(self, loaded: bool = False) -> None:
        """The waiting parts, in order, each to the checking process with the fewest records not answered,
        while one holds fewer than OUTSTANDING_RECORDS (`loaded`: whether or not it said it loaded)."""
        while self.waiting and (loaded or not self.loading):
            side = min(range(len(self.sides)), key=self._load.__getitem__)
            if self._load[side] >= OUTSTANDING_RECORDS:
                return
            message, records, batch = self.waiting.popleft()
            self.sides[side].send(message)
            self._queued[side].append((batch, records))
            self._load[side] += records


def in_parts(items: list) -> list[list]:
    """`items` cut in order into parts of PART_RECORDS, as checking processes take them."""
    return [items[k:k + PART_RECORDS] for k in range(0, len(items), PART_RECORDS)]


def take(counts: dict, answer: tuple[dict, str | None]) -> None:
    """A check's answer (`checks.check`) added to `counts`; CertificateError where it found a mismatch."""
    checked, mismatch = answer
    if mismatch:
        raise CertificateError(f"{mismatch}; {NOTHING_WRITTEN}")
    add_counts(counts, checked)
