"""Errors about the input: one bad record (set aside, the run goes on) or a whole file (the run stops);
and how any error is told to a person (`describe`)."""

import errno


class RecordError(ValueError):
    """A record that cannot be used; `reason` is a short stable slug, the message explains."""

    def __init__(self, reason: str, message: str = "") -> None:
        super().__init__(message or reason)
        self.reason = reason


class InputFileError(ValueError):
    """A whole input file that cannot be read; the message names it and says what is wrong."""


_OS_HINTS = {
    errno.ENOSPC: "no space left on the device: free some or write elsewhere (-o)",
    errno.EDQUOT: "disk quota exceeded: free some space or write elsewhere (-o)",
    errno.EFBIG: "file too large for this file system or limit: write elsewhere (-o)",
    errno.EROFS: "read-only file system: write elsewhere (-o)",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOENT: "no such file or directory",
    errno.ENOTDIR: "a part of this path is a file, not a directory",
    errno.EISDIR: "is a directory, expected a file",
    errno.EEXIST: "exists and is not a directory",
}


def describe(exc: BaseException) -> str:
    """One line a person can act on."""
    if isinstance(exc, OSError) and exc.errno in _OS_HINTS and exc.filename:
        return f"{exc.filename}: {_OS_HINTS[exc.errno]}"
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc)
