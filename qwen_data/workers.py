"""An ordered, bounded parallel map over worker processes.

Results come back in input order; at most `max_in_flight` tasks are queued or buffered at once,
so memory stays flat however long the input. Workers are recycled after `tasks_per_worker`
tasks to bound whatever caches grow inside them (the tokenizer's pretoken cache).
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Iterable, Iterator

import multiprocess


def ordered_map(
    fn: Callable,
    items: Iterable,
    workers: int,
    initializer: Callable | None = None,
    initargs: tuple = (),
    max_in_flight: int | None = None,
    tasks_per_worker: int | None = None,
) -> Iterator:
    max_in_flight = max_in_flight or 2 * workers + 1
    pool = multiprocess.get_context("fork").Pool(
        workers, initializer=initializer, initargs=initargs, maxtasksperchild=tasks_per_worker
    )
    pending: deque = deque()
    try:
        for item in items:
            pending.append(pool.apply_async(fn, (item,)))
            if len(pending) >= max_in_flight:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()
        pool.close()
    finally:
        pool.terminate()
        pool.join()
