"""The tally of a Ray run (`run.ray`): the actor that hands out the parts in order to the tasks that ask and holds
what they report. A module of its own, importing nothing but the standard library: the actor's process unpickles
it before any task can take a part, and imported from `run.ray` it loaded numpy and the pipeline first."""

from __future__ import annotations

import collections


class Tally:
    """The Ray actor handing out the parts, in order, to the tasks that ask, and holding each part's latest
    totals and the parts ended since the driver last asked; reports of an earlier attempt are ignored."""

    def __init__(self, parts: list[int], first: list[int] = ()) -> None:
        """`first[k]`: the part task k's first attempt runs without asking (held by it from the start)."""
        given = set(first)
        self.left = collections.deque(p for p in parts if p not in given)  # the parts not handed out yet, in order
        self.held: dict[int, list[int]] = {task: [part] for task, part in enumerate(first)}  # per task, not ended
        self.tasks: dict[int, int] = {task: 1 for task in range(len(first))}  # per task, its attempts
        self.counts: dict[int, tuple] = {part: (0, 0, 0, 0) for part in first}
        self.attempts: dict[int, int] = {part: 1 for part in first}
        self.picked: list[tuple[int, int, list]] = []  # (part, the first's index, records) not yet taken
        self.finished: list[tuple] = []  # the parts ended (`_shard_task`'s items) not yet taken

    def start(self, task: int) -> int:
        """A task's attempt begins: the parts an earlier attempt of it held (its process died) go back first."""
        self.tasks[task] = self.tasks.get(task, 0) + 1
        self.left.extendleft(sorted(self.held.pop(task, []), reverse=True))
        return self.tasks[task]

    def next(self, task: int, attempt: int, ended: tuple | None = None) -> tuple[int, int] | None:
        """`ended` (the part `task` ended last, `_shard_task`'s item; None: its first call) taken, then
        the next part for `task` and that part's attempt (None: none is left; or this attempt was superseded, and what
        it ended is not taken)."""
        if attempt != self.tasks.get(task):
            return None
        if ended is not None:
            self.end(task, ended)
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

    def end(self, task: int, result: tuple) -> None:
        if result[0] in self.held.get(task, []):
            self.held[task].remove(result[0])
            self.finished.append(result)

    def totals(self) -> tuple[tuple, dict[int, int], list, list]:
        """The parts' summed totals, their attempts, the records reported picked and the parts ended since the
        last call."""
        summed = tuple(sum(c[i] for c in self.counts.values()) for i in range(4))
        picked, self.picked = self.picked, []
        finished, self.finished = self.finished, []
        return summed, dict(self.attempts), picked, finished
