"""Atomic outputs: a run's files appear complete, together, or not at all (one file: `atomic_file`).

Everything is written under temporary names and renamed into place only when complete, with the
manifest (`PREFIX.json`) last: a prefix whose manifest exists is complete. On commit the old
manifest goes first, so a run killed half-way through renaming never leaves new data beside an old
manifest. Every final file is locked (`FILE.lock`, flock) for the whole run, so two runs whose
outputs overlap in any file — `-o d/web` with two text keys writes `d/web_text.*`, as does
`-o d/web_text` — cannot both proceed. The kernel drops a killed run's locks: a stale lock file
never blocks.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading

TMP_SUFFIX = ".tmp"
LOCK_SUFFIX = ".lock"

# Every lock this process holds. A forked worker closes its copies at once: an flock belongs to the
# open file, which a fork shares, so a worker still dying after a killed run would otherwise keep
# that run's outputs locked for a moment.
_held: set = set()


def _close_inherited_locks() -> None:
    for handle in _held:
        handle.close()
    _held.clear()


os.register_at_fork(after_in_child=_close_inherited_locks)


class OutputLocked(RuntimeError):
    pass


class AtomicOutputs:
    """Temporary paths for a declared set of final files, locked at once and committed together.

    `data` files are renamed first, `markers` (manifests) last; every path is removed first when
    the run leaves it out (a stale rejects file from an earlier run, say).
    """

    def __init__(self, final_paths: list[str], keep_on_interrupt: bool = False) -> None:
        """`keep_on_interrupt`: Ctrl-C or SIGTERM leave the tmp files (a run that resumes from them,
        `run.journal`); any other failure removes them."""
        self._declared = list(dict.fromkeys(final_paths))
        self._keep_on_interrupt = keep_on_interrupt
        for directory in {os.path.dirname(os.path.abspath(p)) for p in self._declared}:
            os.makedirs(directory, exist_ok=True)
        self._locks: list[tuple[str, object]] = []
        self._removing: dict[str, threading.Thread] = {}  # path → the thread removing it (`remove_behind`)
        try:
            for path in self._declared:
                self._locks.append((path + LOCK_SUFFIX, _lock(path + LOCK_SUFFIX)))
        except BaseException:
            self._release()
            raise
        self._files: list[str] = []
        self._obsolete: list[str] = []

    def tmp(self, final_path: str) -> str:
        """The temporary path to write `final_path` (one of the declared files) under."""
        if final_path not in self._declared:
            raise ValueError(f"{final_path} was not declared, so it is not locked")
        self._files.append(final_path)
        return final_path + TMP_SUFFIX

    def staged(self, final_path: str) -> str:
        """Where a file this run is writing (through `tmp`) lies until the commit."""
        if final_path not in self._files:
            raise ValueError(f"{final_path} is not being written")
        return final_path + TMP_SUFFIX

    def remove_behind(self, path: str) -> None:
        """Remove `path`, a staged file the run no longer needs, in a thread of its own while the run
        goes on to its end; the outputs are let go (committed, or not) once it is gone. (The file
        system frees a GB in ~0.1-0.4 s: the unpacked samples a packed SFT run stages, as large as its
        output, were removed before its last steps could begin.)"""
        removing = threading.Thread(target=_remove, args=(path,), name="remove-behind", daemon=True)
        removing.start()
        self._removing[path] = removing

    def _removed(self) -> None:
        """Every file `remove_behind` took gone."""
        while self._removing:
            self._removing.popitem()[1].join()

    def discard(self, final_path: str) -> None:
        """Drop a tmp file this run turned out not to need (removed here, if its writer has not); an
        old `final_path` goes at commit."""
        self._files.remove(final_path)
        if final_path + TMP_SUFFIX not in self._removing:
            _remove(final_path + TMP_SUFFIX)
        self._obsolete.append(final_path)

    def leave_out(self, final_path: str) -> None:
        """A declared file this run does not write: an old one there goes at commit."""
        self._obsolete.append(final_path)

    def commit(self, markers: list[str]) -> None:
        """Rename every tmp file into place, the `markers` last (they must be among the tmp files)."""
        renamed, removed = self.commit_order(markers)
        finish_commit(renamed, removed)
        self._release()

    def commit_order(self, markers: list[str]) -> tuple[list[str], list[str]]:
        """What `commit` does: the final paths its tmp files are renamed to, in order, and the old
        files it removes (markers first, so that no old manifest stands beside new data)."""
        return sorted(self._files, key=lambda p: p in markers), markers + self._obsolete + self._files

    def release(self) -> None:
        """Let go of the locks, writing nothing (a commit finished otherwise: `run.journal`)."""
        self._release()

    def abort(self) -> None:
        self._removed()
        for path in self._files:
            if os.path.exists(path + TMP_SUFFIX):
                os.remove(path + TMP_SUFFIX)
        for suffix in (".lengths", ".docends"):  # the index writer's side files
            for path in self._files:
                if os.path.exists(path + TMP_SUFFIX + suffix):
                    os.remove(path + TMP_SUFFIX + suffix)
        self._release()

    def _release(self) -> None:
        self._removed()
        while self._locks:
            path, handle = self._locks.pop()
            os.remove(path)
            _held.discard(handle)
            handle.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt) and self._keep_on_interrupt:
            self._release()
        elif exc_type is not None:
            self.abort()
            if isinstance(exc, OSError) and exc.filename is None:
                # a failed write (disk full ...) names no file: name the outputs it was for
                exc.filename = self._declared[0].rsplit(".", 1)[0] + ".*"
        return False


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def finish_commit(renamed: list[str], removed: list[str]) -> None:
    """A commit (`AtomicOutputs.commit_order`), or the rest of one a killed run began: the old files removed
    where no tmp file is left to take their place, then each tmp file renamed, in order."""
    for path in removed:
        if os.path.lexists(path) and (path not in renamed or os.path.exists(path + TMP_SUFFIX)):
            os.remove(path)
    for path in renamed:
        if os.path.exists(path + TMP_SUFFIX):
            os.replace(path + TMP_SUFFIX, path)


@contextlib.contextmanager
def atomic_file(path: str, mode: str = "w"):
    """A file object for `path` that appears there whole or not at all: written under a name of
    this process's own (other processes or ranks may be writing the same path), renamed on success,
    removed on failure."""
    tmp = f"{path}.{os.getpid()}{TMP_SUFFIX}"
    try:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _lock(path: str):
    """An exclusive flock on `path`, or OutputLocked. Retries when the file was removed between
    opening and locking it (its holder finished): a lock on a removed file guards nothing."""
    while True:
        handle = open(path, "a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise OutputLocked(f"{path[:-len(LOCK_SUFFIX)]}: another qwen-data run is writing this file "
                               f"({path} is locked)") from None
        try:
            if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                _held.add(handle)
                return handle
        except FileNotFoundError:
            pass
        handle.close()
