"""An ordered, bounded parallel map over worker processes.

Results come back in input order; at most `max_in_flight` tasks are queued or buffered at once,
so memory stays flat however long the input. Item i goes to worker i mod n and results are read
back in the same order. A worker is replaced by a fresh one after `tasks_per_worker` tasks, to
bound whatever caches grow inside it (the tokenizer's pretoken cache).

Each worker has its own pipe and the main process has no threads, so nothing is shared that a
dying process could leave locked: ending the map is killing the workers. (multiprocessing.Pool
shares one locked task queue and forks replacements from a thread; terminating it hung when a
worker forked at the wrong moment held that lock.)

Stopping: workers end with the main process, at once and quietly.
- Killed main process (even SIGKILL): the kernel kills the workers (Linux PR_SET_PDEATHSIG), or,
  without prctl, a worker thread sees the parent pid change within 0.1 s; a worker that writes
  to a parent already gone ends through SIGPIPE, without a BrokenPipeError traceback.
- Ctrl-C reaches the whole process group: workers ignore it; the main process gets
  KeyboardInterrupt and kills the workers. SIGINT is held back while a worker is forked and while
  the workers are ended, so an interrupt there cannot leave one running.
- A worker that dies (out of memory, killed) fails the map with an error naming it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import signal
import threading
import time
import traceback
from collections import deque
from typing import Callable, Iterable, Iterator

import multiprocess

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_STOP = None  # sent instead of a task: finish what is queued, then exit


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
    start = (fn, initializer, initargs)
    slots: list[_Worker | None] = [None] * workers
    live: set[_Worker] = set()
    pending: deque[_Worker] = deque()
    finished = False
    try:
        for i, item in enumerate(items):
            worker = slots[i % workers]
            if worker is None or worker.assigned == tasks_per_worker:
                if worker is not None:
                    worker.retire()
                with _sigint_held():  # a worker started is a worker in `live`
                    worker = slots[i % workers] = _Worker(*start)
                    live.add(worker)
            worker.send(item)
            pending.append(worker)
            if len(pending) >= max_in_flight:
                yield _next_result(pending, live)
        for worker in slots:
            if worker is not None:
                worker.retire()
        while pending:
            yield _next_result(pending, live)
        finished = True
    finally:
        with _sigint_held():
            for worker in live:
                worker.end(kill=not finished)


def _next_result(pending: deque, live: set):
    worker = pending.popleft()
    result = worker.result()
    if worker.retired and worker.received == worker.assigned:
        with _sigint_held():
            worker.end(kill=False)
            live.discard(worker)
    return result


class WorkerError(RuntimeError):
    """A worker process ended without giving a result."""


class _RemoteTraceback(Exception):
    """Where in the worker a task's exception was raised (shown as the cause)."""


class _Worker:
    def __init__(self, fn: Callable, initializer: Callable | None, initargs: tuple):
        self.conn, theirs = multiprocess.get_context("fork").Pipe()
        self.assigned = self.received = 0
        self.retired = False
        self.process = multiprocess.get_context("fork").Process(
            target=_serve, args=(theirs, os.getpid(), fn, initializer, initargs), daemon=True
        )
        self.process.start()
        theirs.close()

    def send(self, item) -> None:
        self._send((item,))
        self.assigned += 1

    def retire(self) -> None:
        """No more tasks: the worker exits once its queued ones are answered."""
        if not self.retired:
            self._send(_STOP)
            self.retired = True

    def _send(self, message) -> None:
        try:
            self.conn.send(message)
        except ConnectionError:  # BrokenPipeError would read as our own stdout's reader gone
            raise self._died() from None

    def result(self):
        try:
            ok, value, where = self.conn.recv()
        except (EOFError, ConnectionError):
            raise self._died() from None
        self.received += 1
        if not ok:
            raise value from _RemoteTraceback(where)
        return value

    def _died(self) -> WorkerError:
        self.process.join(1)
        return WorkerError(
            f"worker process {self.process.pid} ended (exit code {self.process.exitcode}) before "
            "answering; out of memory?"
        )

    def end(self, kill: bool) -> None:
        if self.conn.closed:
            return
        if kill and self.process.exitcode is None:
            self.process.kill()
        self.process.join()
        self.process.close()  # here, not in a finalizer at some later moment a Ctrl-C could hit
        self.conn.close()


def _serve(conn, parent: int, fn: Callable, initializer: Callable | None, initargs: tuple) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process decides, then kills us
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # parent gone: end silently, no BrokenPipeError
    _die_with(parent)
    # A thread drains the pipe at once, so the main process never waits to send a task while this
    # process waits for it to read a result.
    tasks: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_receive, args=(conn, tasks), daemon=True).start()
    failed = None
    if initializer is not None:
        try:
            initializer(*initargs)
        except Exception as exc:  # answered to every task, so the main process raises it
            failed = exc, traceback.format_exc()
    while (task := tasks.get()) is not _STOP:
        if failed is not None:
            conn.send((False, *failed))
            continue
        try:
            answer = (True, fn(task[0]), None)
        except Exception as exc:
            answer = (False, exc, traceback.format_exc())
        try:
            conn.send(answer)
        except Exception:  # an exception that cannot be pickled: send its text
            conn.send((False, WorkerError(f"{answer[1]!r}"), answer[2]))


def _receive(conn, tasks: queue.SimpleQueue) -> None:
    while True:
        try:
            task = conn.recv()
        except EOFError:
            task = _STOP
        tasks.put(task)
        if task is _STOP:
            return


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


def _die_with(parent: int) -> None:
    """Make this worker end when `parent` does (PR_SET_PDEATHSIG fires when the forking thread
    ends: here always the main thread, which outlives the map)."""
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
