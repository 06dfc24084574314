"""A one-line progress display on stderr: records/s, MB/s, tokens/s and how far through the input."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total_bytes: int, enabled: bool = True, label: str = "") -> None:
        self.total_bytes = total_bytes
        self.enabled = enabled and sys.stderr.isatty()
        self.label = label
        self.start = time.monotonic()
        self._last = 0.0
        self.records = self.bytes = self.tokens = 0

    def update(self, records: int, nbytes: int, tokens: int) -> None:
        self.records += records
        self.bytes += nbytes
        self.tokens += tokens
        now = time.monotonic()
        if self.enabled and now - self._last >= 0.5:
            self._last = now
            sys.stderr.write("\r" + self.line() + "\033[K")
            sys.stderr.flush()

    def line(self) -> str:
        dt = max(time.monotonic() - self.start, 1e-9)
        done = f"{100 * self.bytes / self.total_bytes:5.1f}% " if self.total_bytes else ""
        return (
            f"{self.label}{done}{self.records:,} records  {self.records / dt:,.0f} rec/s  "
            f"{self.bytes / dt / 1e6:.2f} MB/s  {self.tokens / dt / 1e6:.2f} Mtok/s"
        )

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\r" + self.line() + "\033[K\n")
            sys.stderr.flush()
