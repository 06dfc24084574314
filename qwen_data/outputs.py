"""Atomic outputs and the manifest.

Everything is written under temporary names and renamed into place only when complete, with the
manifest (`PREFIX.json`) last: a prefix whose manifest exists is complete. On commit the old
manifest goes first, so a run killed half-way through renaming never leaves new data beside an old
manifest. A lock file refuses a second run into the same prefix while one is running.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sys
import time

from . import __version__

FORMAT = "qwen-data/1"
TMP_SUFFIX = ".tmp"


class OutputLocked(RuntimeError):
    pass


class AtomicOutputs:
    """Temporary paths for a set of final files, committed together.

    `data` files are renamed first, `markers` (manifests) last; every path is removed first when
    the run leaves it out (a stale rejects file from an earlier run, say).
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        directory = os.path.dirname(os.path.abspath(prefix))
        os.makedirs(directory, exist_ok=True)
        self._lock_path = prefix + ".lock"
        self._lock = open(self._lock_path, "a")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise OutputLocked(f"{prefix}: another qwen-data run is writing this prefix ({self._lock_path} is locked)")
        self._files: list[str] = []
        self._obsolete: list[str] = []

    def tmp(self, final_path: str) -> str:
        """The temporary path to write `final_path` under."""
        self._files.append(final_path)
        return final_path + TMP_SUFFIX

    def discard(self, final_path: str) -> None:
        """Drop a tmp file this run turned out not to need; an old `final_path` goes at commit."""
        self._files.remove(final_path)
        os.remove(final_path + TMP_SUFFIX)
        self._obsolete.append(final_path)

    def commit(self, markers: list[str]) -> None:
        """Rename every tmp file into place, the `markers` last (they must be among the tmp files)."""
        for path in markers + self._obsolete + self._files:
            if os.path.lexists(path):
                os.remove(path)
        for path in sorted(self._files, key=lambda p: p in markers):
            os.replace(path + TMP_SUFFIX, path)
        self._release()

    def abort(self) -> None:
        for path in self._files:
            if os.path.exists(path + TMP_SUFFIX):
                os.remove(path + TMP_SUFFIX)
        for suffix in (".lengths", ".docends"):  # the index writer's side files
            for path in self._files:
                if os.path.exists(path + TMP_SUFFIX + suffix):
                    os.remove(path + TMP_SUFFIX + suffix)
        self._release()

    def _release(self) -> None:
        if not self._lock.closed:
            os.remove(self._lock_path)
            self._lock.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
        return False


def fingerprint(idx_paths: list[str], bin_paths: list[str]) -> str:
    """Changes whenever the data does: the index bytes and the data files' sizes."""
    digest = hashlib.sha256()
    for path in idx_paths:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                digest.update(block)
    for path in bin_paths:
        digest.update(b"%d\0" % os.path.getsize(path))
    return digest.hexdigest()


def base_manifest(kind: str) -> dict:
    return {
        "format": FORMAT,
        "kind": kind,
        "qwen_data_version": __version__,
        "command": sys.argv,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def write_json(path: str, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
        f.write("\n")


def read_manifest(prefix: str) -> dict:
    path = prefix + ".json"
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{prefix}: no manifest {path} (not a qwen-data output, or an unfinished run)")
    with open(path, encoding="utf-8") as f:
        manifest = json.load(f)
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} manifest")
    return manifest
