"""Files derived from others (a tokenizer's arrays, the reference's tables, Unicode's NFC bits), kept in
`cache_dir()` with the sha256 of their bytes beside them, and checked against it before any use."""

from __future__ import annotations

import hashlib
import io
import os
import sys
import tempfile

import numpy as np


def cache_dir() -> str:
    """Where derived files are kept: $XDG_CACHE_HOME/qwen-data (~/.cache)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "qwen-data")


# Beside each derived file, the sha256 of its bytes as built (PATH.sha256): a cache file edited,
# truncated or damaged on disk after its build would give wrong ids to every later run (`verify`
# reads only the data), so it is rebuilt, never used (`checked_bytes`). Reading and hashing what a run
# reads (~2.7 MB for Qwen's: the rank file, an array, the added tokens) takes ~4 ms.
CHECKSUM_SUFFIX = ".sha256"


def checked_bytes(path: str, source: str) -> bytes | None:
    """The bytes of the derived file `path` if they are the ones its build recorded; None where the
    file or its record is missing (never built, a build under way elsewhere, an older qwen-data's
    cache): the caller builds it. A file that is not what was recorded is named on stderr."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        with open(path + CHECKSUM_SUFFIX, encoding="ascii") as f:
            recorded = f.read().strip()
    except (OSError, ValueError):
        return None
    if hashlib.sha256(data).hexdigest() == recorded:
        return data
    print(f"qwen-data: the cached {path} did not match the sha256 recorded when it was derived from {source}; "
          "rebuilt", file=sys.stderr)
    return None


def store(path: str, write) -> str | None:
    """`write(tmp)` to a file beside `path`, then moved onto it, and the sha256 of its bytes
    recorded beside it (`checked_bytes`), after it: concurrent processes read a whole file or none, and a
    file read before its record is only rebuilt. A cache that cannot be written only costs the build.
    → the sha256 of what is now at `path`, None where nothing could be written."""
    digest = _replace(path, write)
    if digest is not None:
        _replace(path + CHECKSUM_SUFFIX, lambda tmp: _write_text(tmp, digest + "\n"))
    return digest


def _replace(path: str, write) -> str | None:
    """`write(tmp)`, then tmp moved onto `path`; the sha256 of what was written, None where it could not be."""
    tmp = None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=os.path.basename(path), suffix=".tmp")
        os.close(fd)
        write(tmp)
        with open(tmp, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide it from other users' runs
        os.replace(tmp, path)
        tmp = None
        return digest
    except OSError:
        return None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def _write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(text)


def cached_array(path: str, source: str, build, fits) -> np.ndarray:
    """The array kept at `path` (a .npy derived from `source`, named where it is found damaged) where its
    bytes are the ones recorded and `fits(array)`; else `build()`, kept there for the next run."""
    data = checked_bytes(path, source)
    if data is not None:
        try:
            array = np.load(io.BytesIO(data), allow_pickle=False)
            if fits(array):
                return array
        except (ValueError, EOFError):
            pass
    array = build()

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            np.save(f, array)

    store(path, write)
    return array
