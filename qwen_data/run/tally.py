"""The tally of a Ray run (`run.ray`): the actor that hands out the parts in order to the tasks that ask and holds
what they report. A module of its own, importing nothing but the standard library: the actor's process unpickles
it before any task can take a part, and imported from `run.ray` it loaded numpy and the pipeline first."""

from __future__ import annotations

import collections


class Tally:
    """The Ray actor handing out the parts, in order, to the tasks that ask, and holding each part's latest
    totals and the parts ended since the driver last asked; reports of an earlier attempt are ignored.

    It also says where each part's bytes go: a task tells each part's sizes (one a file the output's .bin files
    are joined into, `run.ray`'s heads) as it ends it, and a part's offsets in those files are known once every
    part before it has told its own (`offsets`); the task writes the bytes there itself and tells so
    (`tell_placed`). Only then is the part ended for the driver (`totals`): an ended part is whole in the heads."""

    def __init__(self, parts: list[int], first: list[int] = (), sizes: dict[int, list[int]] | None = None) -> None:
        """`first[k]`: the part task k's first attempt runs without asking (held by it from the start). `sizes`:
        those of the parts not run (an earlier run's, reused), by part."""
        given = set(first)
        self.left = collections.deque(p for p in parts if p not in given)  # the parts not handed out yet, in order
        self.held: dict[int, list[int]] = {task: [part] for task, part in enumerate(first)}  # per task, not ended
        self.tasks: dict[int, int] = {task: 1 for task in range(len(first))}  # per task, its attempts
        self.counts: dict[int, tuple] = {part: (0, 0, 0, 0) for part in first}
        self.attempts: dict[int, int] = {part: 1 for part in first}
        self.picked: list[tuple[int, int, list]] = []  # (part, the first's index, records) not yet taken
        self.finished: list[tuple] = []  # the parts ended (`_shard_task`'s items) not yet taken
        self.sizes: dict[int, list[int]] = dict(sizes or {})  # by part, told (or reused)
        self.starts: list[list[int]] = []  # where part k's bytes start in each file, for the parts 0..k known
        self.unplaced: dict[int, list[int]] = {}  # per task, the parts it made whose bytes are not yet placed
        self.made: dict[int, tuple] = {}  # by part, made and not placed: its `_shard_task` item
        self._extend()

    def start(self, task: int) -> int:
        """A task's attempt begins: the parts an earlier attempt of it held (its process died) go back first, and
        so do those it made but had not placed (their bytes died with it)."""
        self.tasks[task] = self.tasks.get(task, 0) + 1
        unplaced = self.unplaced.pop(task, [])
        for part in unplaced:
            del self.made[part]
        self.left.extendleft(sorted(self.held.pop(task, []) + unplaced, reverse=True))
        return self.tasks[task]

    def next(self, task: int, attempt: int, ended: tuple | None = None,
             sizes: list[int] = ()) -> tuple[tuple[int, int] | None, dict[int, list[int]]]:
        """`ended` (the part `task` made last, `_shard_task`'s item, and `sizes`, its bytes for each file; None:
        its first call) taken; → the next part for `task` and that part's attempt (None: none is left; or this
        attempt was superseded, and what it made is not taken), and the offsets now known of the parts it has not
        placed (`offsets`)."""
        if attempt != self.tasks.get(task):
            return None, {}
        if ended is not None:
            self.end(task, ended, sizes)
        return self._hand(task), self.offsets(task)

    def _hand(self, task: int) -> tuple[int, int] | None:
        if not self.left:
            return None
        part = self.left.popleft()
        self.held.setdefault(task, []).append(part)
        self.attempts[part] = self.attempts.get(part, 0) + 1
        self.counts[part] = (0, 0, 0, 0)
        return part, self.attempts[part]

    def held_by(self, task: int) -> int | None:
        held = self.held.get(task)
        return held[0] if held else None

    def report(self, part: int, attempt: int, counts: tuple, first: int = 0, picked: list = ()) -> None:
        if attempt == self.attempts.get(part):
            self.counts[part] = counts
            if picked:
                self.picked.append((part, first, picked))

    def end(self, task: int, result: tuple, sizes: list[int]) -> None:
        part, sizes = result[0], list(sizes)
        if part not in self.held.get(task, []):
            return
        if self.sizes.setdefault(part, sizes) != sizes:  # (the parts after it went where its first sizes put them)
            raise RuntimeError(f"part {part} was made again with other sizes ({sizes}) than the first time "
                               f"({self.sizes[part]}): its work did not repeat exactly")
        self.held[task].remove(part)
        self.made[part] = result
        self.unplaced.setdefault(task, []).append(part)
        self._extend()

    def _extend(self) -> None:
        """The parts' offsets, as far as every part before is known."""
        while len(self.starts) in self.sizes:
            k = len(self.starts)
            self.starts.append([0] * len(self.sizes[k]) if k == 0 else
                               [a + b for a, b in zip(self.starts[k - 1], self.sizes[k - 1])])

    def offsets(self, task: int, attempt: int | None = None) -> dict[int, list[int]]:
        """Where the bytes of the parts `task` ended and has not placed start in each file, where known (every
        part before told its sizes); {} for a superseded `attempt`."""
        if attempt is not None and attempt != self.tasks.get(task):
            return {}
        return {part: self.starts[part] for part in self.unplaced.get(task, []) if part < len(self.starts)}

    def tell_placed(self, task: int, attempt: int, parts: list[int]) -> None:
        """`parts`' bytes were written where `offsets` said, by this attempt of `task`: they are ended."""
        if attempt != self.tasks.get(task):
            return
        for part in parts:
            if part in self.unplaced.get(task, []):
                self.unplaced[task].remove(part)
                self.finished.append(self.made.pop(part))

    def totals(self) -> tuple[tuple, dict[int, int], list, list]:
        """The parts' summed totals, their attempts, the records reported picked and the parts ended (placed)
        since the last call."""
        summed = tuple(sum(c[i] for c in self.counts.values()) for i in range(4))
        picked, self.picked = self.picked, []
        finished, self.finished = self.finished, []
        return summed, dict(self.attempts), picked, finished
