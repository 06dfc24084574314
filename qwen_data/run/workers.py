"""An ordered, bounded parallel map over worker processes.

Results come back in input order, but a task goes to whichever worker is free: a slow task holds
back only the results after it, never the other workers, which go on with the next tasks while
there is room. At most SLOTS tasks a worker are queued, running or finished and waiting for their
turn, so memory stays flat however long the input.

Bulk results travel through shared memory: every worker position has an arena of slots mapped
before its worker is forked; a task is given a free slot, the worker copies the result's
`shared_fields` arrays into it, and the main process reads them in place (no pickling, no pipe).
Such arrays are views of the slot: they are valid until the next result is asked for, when the
slot may be given to another task. A result too big for its slot goes through the pipe whole.

The consumer may instead have the worker that made a result write its arrays into files itself
(`Placement.write`, where they belong, at offsets the consumer hands out in order): the bytes then
pass through no other process, and the slot stays taken until the worker says they are written.
It may also hand a worker an errand (`errand`: a call beside its tasks, run by a thread of the worker's
own, answered as a write is: packed rows laid out from files the workers wrote, `layouts.Rows`).

A worker is replaced by a fresh one once it has grown by `worker_growth` bytes of resident memory
(or after `tasks_per_worker` tasks), to bound whatever caches grow inside it (the tokenizer's
pretoken cache); the replacement is forked when its position gets its next task.

Each worker has its own pipe and the main process has no threads while it forks (`before_fork`
lets the caller stop its own), so nothing is shared that a dying process could leave locked:
ending the map is killing the workers. (multiprocessing.Pool shares one locked task queue and
forks replacements from a thread; terminating it hung when a worker forked at the wrong moment
held that lock.)

Messages cross the pipes pickled by Python's C pickler (multiprocess's own pickles with dill, in pure
Python: ~50 µs an object, which made the certificate's picked records cost a large run seconds of
its main process); dill only for what the C pickler refuses (`_dumps`).

Stopping: workers end with the main process, at once and quietly.
- Killed main process (even SIGKILL): the kernel kills the workers (Linux PR_SET_PDEATHSIG), or,
  without prctl, a worker thread sees the parent pid change within 0.1 s; a worker that writes
  to a parent already gone ends through SIGPIPE, without a BrokenPipeError traceback.
- Ctrl-C reaches the whole process group: workers ignore it; the main process gets
  KeyboardInterrupt and kills the workers. SIGINT is held back while a worker is forked and while
  the workers are ended, so an interrupt there cannot leave one running. SIGTERM (`timeout`, a
  scheduler: often the whole group too) is treated the same: workers ignore it, it is held back
  likewise, and the main process does what its handler says (`qwen-data` raises, as for Ctrl-C).
- A worker that dies (out of memory, killed) fails the map with an error naming it.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import queue
import signal
import socket
import threading
import time
import traceback
from typing import Callable, Iterable, Iterator, NamedTuple

import multiprocess
import numpy as np
from multiprocess.connection import Connection, wait

from ..formats.indexed import Behind, pwrite_all
from .lifetime import STOPPING, die_with

_STOP = None  # sent instead of a task: finish what is queued, then exit
QUEUED = 2  # tasks a worker holds at once: one running, one ready to start when it ends
SLOTS = 4  # per worker position: its queued tasks, and two finished ones waiting for their turn
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def ordered_map(fn: Callable, items: Iterable, workers: int, tasks_per_worker: int | None = None,
                worker_growth: int | None = None, shared_fields: tuple[str, ...] = (), slot_bytes: int = 0,
                before_fork: Callable[[], None] | None = None, ending: Callable[[], None] | None = None) -> Iterator:
    """`fn(item)` for every item, in order. A worker is replaced after `tasks_per_worker` tasks or
    once it grew by `worker_growth` bytes; `shared_fields`: attributes of a result holding numpy
    arrays (or lists of them) that travel through slots of `slot_bytes` each; `before_fork` runs
    before each worker is forked; `ending` once the last result was taken and written, while the
    workers still take errands (`errand`: the consumer's last ones)."""
    return _OrderedMap(fn, workers, tasks_per_worker, worker_growth, shared_fields, slot_bytes,
                       before_fork).run(items, ending)


class _OrderedMap:
    """`ordered_map`'s state: the worker positions, the live workers, the results waiting for their turn."""

    def __init__(self, fn, workers, tasks_per_worker, worker_growth, shared_fields, slot_bytes, before_fork) -> None:
        self.fn, self.shared_fields, self.slot_bytes = fn, shared_fields, slot_bytes
        self.tasks_per_worker, self.worker_growth, self.before_fork = tasks_per_worker, worker_growth, before_fork
        self.positions = [_Position(SLOTS, slot_bytes if shared_fields else 0) for _ in range(workers)]
        self.live: set[_Worker] = set()
        self.done: dict[int, tuple[_Worker, int, object]] = {}  # finished, waiting for their turn
        self.writing: dict[tuple[_Worker, int], "Placement | Errand"] = {}  # (worker, slot) → a write asked of it
        self.sent = self.errands = 0

    def run(self, items: Iterable, ending: Callable[[], None] | None = None) -> Iterator:
        items, turn, exhausted, finished = iter(items), 0, False, False
        try:
            while True:
                # Results that came while the caller had the last one, taken at once: their workers
                # get their next tasks now, not once the caller runs out of results to take (at 16
                # workers of packed SFT they waited ~0.9 s each so).
                self._receive(timeout=0)
                exhausted = exhausted or self._send_more(items)
                if turn in self.done:
                    worker, slot, result = self.done.pop(turn)
                    turn += 1
                    placement = None
                    if worker.slotted(result):  # (`_restored`'s: an object of attributes)
                        placement = result.placement = Placement(self, worker, slot)
                    yield result
                    if placement is None or not placement.asked:
                        worker.position.slots.append(slot)  # the consumer is done with the result's views
                    continue
                if exhausted and turn == self.sent and not self.writing:
                    if ending is None:
                        break
                    ending, last = None, ending
                    last()  # (its errands are waited for as any)
                    continue
                self._receive()
            for worker in self.live:
                worker.retire()  # each exits once it reads this: nothing is queued any more
            finished = True
        finally:
            with _stops_held():
                for worker in self.live:
                    worker.end(kill=not finished)

    def errand(self, fn: Callable, arg, then: Callable | None = None) -> "Errand | None":
        """`fn(arg)` run by a worker beside its tasks (the one with the fewest errands and writes
        asked of it), answered apart from them: `then(what fn gave)` runs here once it is (in the
        consumer's thread); the map ends once it is done, and fails with its error. None where no
        worker takes messages any more (the map is ending): the caller runs it itself."""
        idle = [worker for worker in self.live if not worker.retired and not worker.conn.closed]
        if not idle:
            return None
        worker = min(idle, key=lambda w: w.writes)
        self.errands += 1
        key = -self.errands  # (never a slot's number)
        worker.ask((None, key, _Call(fn, arg)))
        errand = self.writing[worker, key] = Errand(then)
        return errand

    def _send_more(self, items: Iterator) -> bool:
        """Tasks to every free position; → whether `items` ran out."""
        while (position := _free(self.positions)) is not None:
            item = next(items, _STOP)
            if item is _STOP:
                return True
            worker = position.worker
            if worker is None or worker.retired:
                if self.before_fork is not None:
                    self.before_fork()
                with _stops_held():  # a worker started is a worker in `live`
                    worker = position.worker = _Worker(self.fn, self.shared_fields, position, self.slot_bytes)
                    self.live.add(worker)
            worker.send(self.sent, position.slots.pop(), item)
            if worker.assigned == self.tasks_per_worker:
                worker.retire()
            self.sent += 1
        return False

    def _receive(self, timeout: float | None = None) -> None:
        """The results that are ready (at least one, unless `timeout`), each kept for its turn; workers
        done ended."""
        busy = {w.conn: w for w in self.live if w.outstanding or w.writes}
        if not busy and timeout is not None:
            return
        for conn in wait(list(busy), timeout):
            worker = busy[conn]
            index, slot, result = worker.result()
            if index is None:  # a write asked of it (`Placement.write`), or an errand, is done
                self.writing.pop((worker, slot)).written(result)
            else:
                self.done[index] = (worker, slot, result)
            if self.worker_growth is not None and worker.grown > self.worker_growth:
                worker.retire()
            if worker.retired and not worker.outstanding and not worker.writes:
                with _stops_held():
                    worker.end(kill=False)
                    self.live.discard(worker)


class Placement:
    """Where a result read from a slot (`_OrderedMap.run`) may be written by the worker that made it."""

    def __init__(self, owner: _OrderedMap, worker: "_Worker", slot: int) -> None:
        self.owner, self.worker, self.slot = owner, worker, slot
        self.asked = False  # the worker was asked to write, and holds the slot until it has
        self.done = True
        self.then = None  # called once the worker says they are written (in the consumer's thread)

    def write(self, targets: list[tuple[str, np.ndarray, int]]) -> None:
        """Each (path, array of the result, offset): the array's bytes written at that offset of the
        file (opened there without O_APPEND, which would put them at its end). Asked of the worker
        when it is still taking messages; a worker told to stop may have read its last one, so then
        they are written here. `done` once they are."""
        worker, arena = self.worker, self.worker.position.arena
        where = [(path, _arena_offset(arena, array), array.nbytes, offset) for path, array, offset in targets]
        if worker.retired or worker.conn.closed:
            for path, start, size, offset in where:
                fd = os.open(path, os.O_WRONLY)  # (never kept: this process outlives the run's files)
                try:
                    _write_range(fd, arena, start, size, offset)
                finally:
                    os.close(fd)
            return
        worker.ask((None, self.slot, where))
        self.owner.writing[worker, self.slot] = self
        self.asked, self.done = True, False

    def written(self, _=None) -> None:
        self.done = True
        self.worker.position.slots.append(self.slot)
        if self.then is not None:
            self.then()


class Errand:
    """A call a worker was asked to run (`_OrderedMap.errand`): `done` once it says it ran."""

    def __init__(self, then: Callable | None) -> None:
        self.done, self.then = False, then

    def written(self, value) -> None:
        self.done = True
        if self.then is not None:
            self.then(value)


class _Call(NamedTuple):
    """An errand as it crosses the pipe: `fn(arg)`."""

    fn: Callable
    arg: object


class SideProcess:
    """One worker process beside a map, for work handed over as the map goes and answered at the
    end: `send(item)` has `fn(item)` run there, in order; `answers()` waits for all of them. Sending
    never waits for the worker: items are written to its pipe by a thread of their own (`Behind`,
    paused before a fork as every one is). The worker's reading thread drains the pipe only when the
    GIL of a process busy checking lets it, so a write could wait there, and the caller with it (a
    large run's main thread, the funnel of its results). Start it before the map's workers and any
    thread, and `end` it in a `finally`. `forked`: (pid, socket) of a process forked earlier that
    serves `fn` already (`prestart.take`), adopted instead of forking one."""

    def __init__(self, fn: Callable, forked: tuple[int, socket.socket] | None = None) -> None:
        with _stops_held():
            adopted = None if forked is None else (Connection(forked[1].detach()), _Forked(forked[0]))
            self._worker = _Worker(fn, (), _Position(0, 0), 0, adopted)
        self._outbox = Behind()
        self._write = lambda message: self._outbox.submit(self._worker._send, message)

    def send(self, item) -> None:
        self._worker.send(self._worker.assigned, 0, item, self._write)

    def arrived(self) -> list:
        """The answers that have come so far, in order, without waiting for more: read as they come,
        they never fill the pipe back, where the process would wait to write the next one."""
        answers = []
        while self._worker.outstanding and self._worker.conn.poll():
            answers.append(self._worker.result()[2])
        return answers

    def answer(self):
        """The next answer, waiting for it; a `fn` that raised raises here."""
        return self._worker.result()[2]

    def answers(self) -> list:
        """Every answer not read yet, in the order the items were sent; a `fn` that raised raises here."""
        self._outbox.pause()  # every item written (a write's error raised here)
        answers = [self._worker.result()[2] for _ in range(self._worker.outstanding)]
        self._worker.retire()
        return answers

    def end(self, kill: bool = True) -> None:
        with _stops_held():
            self._worker.end(kill)
        self._outbox.close(failed=True)  # (after the kill: a write to a full pipe then fails, never waits)


class _Forked:
    """A child forked by os.fork (`prestart`), with what `_Worker` asks of a multiprocess Process."""

    def __init__(self, pid: int) -> None:
        self.pid, self.exitcode = pid, None

    def join(self, timeout: float | None = None) -> None:
        waited = 0.0
        while self.exitcode is None:
            done, status = os.waitpid(self.pid, 0 if timeout is None else os.WNOHANG)
            if done:
                self.exitcode = os.waitstatus_to_exitcode(status)
            elif waited >= timeout:
                return
            else:
                time.sleep(0.01)
                waited += 0.01

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def close(self) -> None:
        pass


def _free(positions: list["_Position"]) -> "_Position | None":
    """The position to give the next task: a free slot, room in its worker's queue, and the
    fewest tasks queued there (a position without a worker yet counts as idle)."""
    best = None
    for position in positions:
        worker = position.worker
        queued = 0 if worker is None or worker.retired else worker.outstanding
        if position.slots and queued < QUEUED and (best is None or queued < best[0]):
            best = (queued, position)
    return None if best is None else best[1]


class _Position:
    """A place for one worker at a time, with the slots of its arena (shared memory mapped before any
    worker of the place is forked, so each of them writes where the main process reads)."""

    def __init__(self, slots: int, slot_bytes: int) -> None:
        self.slots = list(range(slots))
        self.arena = mmap.mmap(-1, slots * slot_bytes) if slot_bytes else None
        self.worker: _Worker | None = None


class WorkerError(RuntimeError):
    """A worker process ended without giving a result."""


class _RemoteTraceback(Exception):
    """Where in the worker a task's exception was raised (shown as the cause)."""


class _Worker:
    def __init__(self, fn: Callable, shared_fields: tuple, position: _Position, slot_bytes: int, forked=None):
        """`forked`: (connection, process) of a process already serving `fn` (`prestart`), else one is forked."""
        self.assigned = self.outstanding = self.writes = 0
        self.retired = False
        self.position, arena = position, position.arena
        # Growth counts from the worker's size after its first task (what forking and one task take).
        self.start_rss: int | None = None
        self.grown = 0
        if forked is not None:
            self.conn, self.process = forked
            return
        self.conn, theirs = multiprocess.get_context("fork").Pipe()
        self.process = multiprocess.get_context("fork").Process(
            target=serve, args=(theirs, os.getpid(), fn, shared_fields, arena, slot_bytes),
            daemon=True,
        )
        self.process.start()
        theirs.close()

    def send(self, index: int, slot: int, item, write: Callable | None = None) -> None:
        """`write`: what hands the message to `_send` (default: this thread, at once)."""
        (write or self._send)((index, slot, item))
        self.assigned += 1
        self.outstanding += 1

    def ask(self, message) -> None:
        """A write of a result's slot to files (`Placement.write`), answered apart from the tasks."""
        self._send(message)
        self.writes += 1

    def slotted(self, result) -> bool:
        """Whether `result` was read from this worker's slot (its arrays views of it)."""
        return self.position.arena is not None and getattr(result, "_slotted", False)

    def retire(self) -> None:
        """No more tasks: the worker exits once its queued ones are answered."""
        if not self.retired:
            self._send(_STOP)
            self.retired = True

    def _send(self, message) -> None:
        try:
            self.conn.send_bytes(_dumps(message))
        except ConnectionError:  # BrokenPipeError would read as our own stdout's reader gone
            raise self._died() from None

    def result(self) -> tuple[int, int, object]:
        """(index, slot, result) of the next task this worker answers."""
        try:
            index, slot, ok, value, where, rss = pickle.loads(self.conn.recv_bytes())
        except (EOFError, ConnectionError):
            raise self._died() from None
        if index is None:  # a write or an errand asked of it (`ask`)
            self.writes -= 1
            if not ok:
                raise WorkerError(value)
            return None, slot, value
        self.outstanding -= 1
        if self.start_rss is None:
            self.start_rss = rss
        self.grown = rss - self.start_rss
        if not ok:
            raise value from _RemoteTraceback(where)
        return index, slot, _restored(value, self.position.arena)

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


# -- results in shared memory ---------------------------------------------------------------------
class _InSlot:
    """Where a worker put an array in its arena: read in place by the main process."""

    __slots__ = ("offset", "dtype", "shape")

    def __init__(self, offset: int, dtype: str, shape: tuple) -> None:
        self.offset, self.dtype, self.shape = offset, dtype, shape


class _Placed:
    """A result whose shared fields are `_InSlot`s (or lists of them)."""

    def __init__(self, result, fields: dict) -> None:
        self.result, self.fields = result, fields


def _place(result, fields: tuple, arena: mmap.mmap, start: int, size: int):
    """`result` with its `fields` copied into the arena's slot at `start`; unchanged when they do
    not fit, or when a field holds no arrays."""
    arrays = {}
    total = 0
    for name in fields:
        value = getattr(result, name)
        group = value if isinstance(value, list) else [value]
        if not all(isinstance(a, np.ndarray) for a in group):
            return result
        arrays[name] = [np.ascontiguousarray(a) for a in group]
        total += sum(-(-a.nbytes // 8) * 8 for a in arrays[name])
    if total > size:
        return result
    offset, placed = start, {}
    for name, group in arrays.items():
        spots = []
        for a in group:
            np.frombuffer(arena, np.uint8, a.nbytes, offset)[:] = a.reshape(-1).view(np.uint8)
            spots.append(_InSlot(offset, a.dtype.str, a.shape))
            offset += -(-a.nbytes // 8) * 8  # aligned for any dtype
        placed[name] = spots if isinstance(getattr(result, name), list) else spots[0]
        setattr(result, name, None)  # not pickled
    return _Placed(result, placed)


def _restored(value, arena: mmap.mmap | None):
    if not isinstance(value, _Placed):
        return value
    for name, spots in value.fields.items():
        views = [_view(arena, s) for s in (spots if isinstance(spots, list) else [spots])]
        setattr(value.result, name, views if isinstance(spots, list) else views[0])
    value.result._slotted = True  # (`_Worker.slotted`)
    return value.result


def _arena_offset(arena: mmap.mmap, array: np.ndarray) -> int:
    """Where a view of the arena (`_view`) starts in it."""
    base = np.frombuffer(arena, np.uint8, 1)
    return array.__array_interface__["data"][0] - base.__array_interface__["data"][0]


_FILES: dict[str, int] = {}  # a worker's descriptors of the files it writes results into, by path (one run's)


def _opened(path: str) -> int:
    if path not in _FILES:
        _FILES[path] = os.open(path, os.O_WRONLY)
    return _FILES[path]


def _write_range(fd: int, arena: mmap.mmap, start: int, size: int, offset: int) -> None:
    pwrite_all(fd, memoryview(arena)[start:start + size], offset)


def _write_slot(message, arena: mmap.mmap | None) -> tuple:
    """A write asked of this worker (`Placement.write`) done: the answer the main process reads."""
    _, slot, where = message
    path = None
    try:
        for path, start, size, offset in where:
            _write_range(_opened(path), arena, start, size, offset)
    except Exception as exc:  # (any: the main process waits for this answer)
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else repr(exc)
        return None, slot, False, f"worker {os.getpid()} writing {path}: {why}", None, 0
    return None, slot, True, None, None, 0


def _run_errands(errands: queue.SimpleQueue, written: queue.SimpleQueue) -> None:
    """The errands asked of this worker (`_OrderedMap.errand`), in order, each answered as a write is."""
    while (message := errands.get()) is not None:
        _, key, call = message
        try:
            written.put((None, key, True, call.fn(call.arg), None, 0))
        except Exception as exc:  # (any: the main process waits for this answer)
            why = repr(exc) if not isinstance(exc, OSError) or not exc.strerror else \
                f"{exc.strerror} ({exc.filename})" if exc.filename else exc.strerror
            written.put((None, key, False, f"worker {os.getpid()} running {call.fn.__qualname__}: {why}", None, 0))


def _view(arena: mmap.mmap, spot: _InSlot) -> np.ndarray:
    dtype = np.dtype(spot.dtype)
    count = int(np.prod(spot.shape, dtype=np.int64))
    array = np.frombuffer(arena, dtype, count, spot.offset).reshape(spot.shape)
    array.flags.writeable = False  # the slot's: a consumer that keeps data copies it
    return array


# -- the worker process ---------------------------------------------------------------------------
def serve(conn, parent: int, fn: Callable, shared_fields: tuple, arena: mmap.mmap | None, slot_bytes: int) -> None:
    for signum in STOPPING:  # the main process decides, then kills us
        signal.signal(signum, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # parent gone: end silently, no BrokenPipeError
    die_with(parent)
    # A thread drains the pipe at once, so the main process never waits to send a task while this
    # process waits for it to read a result.
    tasks: queue.SimpleQueue = queue.SimpleQueue()
    sending = threading.Lock()  # answers and writes' answers go out whole, one at a time
    # Writes' answers are sent by a thread of their own: the one draining the pipe never waits on it.
    written: queue.SimpleQueue = queue.SimpleQueue()
    answering = threading.Thread(target=_answer_writes, args=(conn, written, sending), daemon=True)
    answering.start()
    # Errands run by a thread of their own: the one draining the pipe never waits on one either.
    errands: queue.SimpleQueue = queue.SimpleQueue()
    running = threading.Thread(target=_run_errands, args=(errands, written), daemon=True)
    running.start()
    threading.Thread(target=_receive, args=(conn, tasks, arena, written, errands), daemon=True).start()
    while (task := tasks.get()) is not _STOP:
        index, slot, item = task
        try:
            result = fn(item)
            if arena is not None:
                result = _place(result, shared_fields, arena, slot * slot_bytes, slot_bytes)
            answer = (index, slot, True, result, None, _rss())
        except Exception as exc:
            answer = (index, slot, False, exc, traceback.format_exc(), 0)
        try:
            message = _dumps(answer)
        except Exception:  # an exception that cannot be pickled: send its text
            message = _dumps((index, slot, False, WorkerError(f"{answer[3]!r}"), answer[4], 0))
        with sending:
            conn.send_bytes(message)
    errands.put(None)  # every errand asked before the stop (the pipe is read in order) run, then answered
    running.join()
    written.put(None)  # every write asked before the stop is done: its answer sent
    answering.join()


def _receive(conn, tasks: queue.SimpleQueue, arena: mmap.mmap | None, written: queue.SimpleQueue,
             errands: queue.SimpleQueue) -> None:
    """The pipe drained: tasks queued for the worker's loop, errands for theirs, writes of its slots
    done here at once (`Placement.write`: the loop goes on with its task meanwhile; the write lets
    go of the GIL)."""
    while True:
        try:
            task = pickle.loads(conn.recv_bytes())
        except EOFError:
            task = _STOP
        if task is not _STOP and task[0] is None:
            if isinstance(task[2], _Call):
                errands.put(task)
            else:
                written.put(_write_slot(task, arena))
            continue
        tasks.put(task)
        if task is _STOP:
            return


def _answer_writes(conn, written: queue.SimpleQueue, sending: threading.Lock) -> None:
    while (answer := written.get()) is not None:
        message = _dumps(answer)
        with sending:
            conn.send_bytes(message)


def _dumps(message) -> bytes:
    try:
        return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):  # a lambda, a local class: dill's
        import dill

        return dill.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def _rss() -> int:
    """This process's resident memory in bytes (0 where /proc does not tell)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


@contextlib.contextmanager
def _stops_held():
    """Inside, Ctrl-C and SIGTERM are only noted; each takes effect (its handler: KeyboardInterrupt
    for Ctrl-C) on leaving."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread runs signal handlers
        return
    # None: a handler Python cannot put back, left as it is
    held = [signum for signum in STOPPING if signal.getsignal(signum) is not None]
    caught: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, frame: caught.append(signum)) for signum in held}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(caught):
            signal.raise_signal(signum)  # now handled as it would have been
