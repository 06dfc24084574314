"""Errors about the input: one bad record (set aside, the run goes on) or a whole file (the run stops)."""


class RecordError(ValueError):
    """A record that cannot be used; `reason` is a short stable slug, the message explains."""

    def __init__(self, reason: str, message: str = "") -> None:
        super().__init__(message or reason)
        self.reason = reason


class InputFileError(ValueError):
    """A whole input file that cannot be read; the message names it and says what is wrong."""
