"""An ordered, bounded parallel map over worker processes.

Results come back in input order; at most `max_in_flight` tasks are queued or buffered at once,
so memory stays flat however long the input. Workers are recycled after `tasks_per_worker`
tasks to bound whatever caches grow inside them (the tokenizer's pretoken cache).

Stopping: workers end with the main process, at once and quietly.
- Killed main process (even SIGKILL): the kernel kills the workers (Linux PR_SET_PDEATHSIG), or a
  worker thread sees the parent pid change within 0.1 s (see `_die_with`); a worker that writes
  to a parent already gone ends through SIGPIPE, without a BrokenPipeError traceback.
- Ctrl-C reaches the whole process group: workers ignore it; the main process gets
  KeyboardInterrupt and terminates the pool. SIGINT is held back while the pool forks its workers
  and while it is torn down: a KeyboardInterrupt inside either left workers nobody terminates
  (and the exit waiting on them forever).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
import time
from collections import deque
from typing import Callable, Iterable, Iterator

import multiprocess

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


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
    pool = None
    pending: deque = deque()
    try:
        with _sigint_held():
            pool = multiprocess.get_context("fork").Pool(
                workers,
                initializer=_start_worker,
                initargs=(os.getpid(), threading.main_thread(), initializer, initargs),
                maxtasksperchild=tasks_per_worker,
            )
        for item in items:
            pending.append(pool.apply_async(fn, (item,)))
            if len(pending) >= max_in_flight:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()
        pool.close()
    finally:
        if pool is not None:
            with _sigint_held():
                pool.terminate()
                pool.join()


@contextlib.contextmanager
def _sigint_held():
    """Inside, Ctrl-C is only noted; it takes effect (KeyboardInterrupt) on leaving."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield  # only the main thread runs signal handlers; None: a handler Python cannot put back
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            signal.raise_signal(signal.SIGINT)  # now handled as it would have been


def _start_worker(parent: int, parent_main_thread, initializer: Callable | None, initargs: tuple) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process decides, then terminates us
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # parent gone: end silently, no BrokenPipeError
    _die_with(parent, forked_by_main_thread=threading.current_thread() is parent_main_thread)
    if initializer is not None:
        initializer(*initargs)


def _die_with(parent: int, forked_by_main_thread: bool) -> None:
    """Make this worker end when `parent` does.

    PR_SET_PDEATHSIG fires when the thread that forked us ends, not the process. The main thread
    outlives the pool, but the workers Pool re-forks from its own maintenance thread (every
    `tasks_per_worker` tasks) would be killed when that thread ends at close, perhaps holding the
    task queue's lock, and terminate() would then wait for that lock forever. Those workers, and
    any without prctl, watch the parent pid from a thread instead (the tokenizers release the GIL,
    so the thread runs while a chunk is encoded).
    """
    if forked_by_main_thread:
        try:
            prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):  # not Linux
            prctl = None
        if prctl is not None and prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
            if os.getppid() != parent:  # the parent died before prctl took effect
                os._exit(1)
            return
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.1)
    os._exit(1)
