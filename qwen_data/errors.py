"""The one error type every step raises for a bad input record."""


class RecordError(ValueError):
    """A record that cannot be used; `reason` is a short stable slug, the message explains."""

    def __init__(self, reason: str, message: str = "") -> None:
        super().__init__(message or reason)
        self.reason = reason
