"""Progress of a long command (tokenizing, merging, distributed runs) on stderr.

On a terminal: a tqdm bar over the input's on-disk bytes, with records, rec/s, MB/s and Mtok/s.
Elsewhere (batch logs): one plain line every `interval` seconds and a final line with the totals.
"""

from __future__ import annotations

import os
import sys
import threading
import time

INTERVAL_ENV = "QWEN_DATA_PROGRESS_INTERVAL"
LOG_INTERVAL = 30.0  # seconds between lines in a log: often enough to see a stall, rarely enough to read
TERMINAL_INTERVAL = 0.5  # a bar redrawn more often costs time and is no easier to read


def _interval_from_env() -> float:
    value = os.environ.get(INTERVAL_ENV)
    if value is None or value.strip() == "":
        return LOG_INTERVAL
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    # Refused at the start rather than ignored: a typo would otherwise silence a week-long job's log.
    if not seconds >= 0:
        raise ValueError(f"{INTERVAL_ENV}={value!r}: expected a number of seconds >= 0")
    return seconds


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


class Progress:
    """Counts records, text bytes, tokens and input bytes, and shows them at most every `interval` s.

    `total_bytes` is the inputs' size on disk (0: unknown, so no percentage and no ETA);
    `input_bytes` in update()/set() is how far through it we are (compressed bytes for .gz/.zst/.xz);
    `text_bytes` is the uncompressed record text processed, the MB/s shown.
    `interval` defaults to 0.5 s on a terminal, else to $QWEN_DATA_PROGRESS_INTERVAL or 30 s.
    """

    def __init__(self, total_bytes: int, enabled: bool = True, label: str = "",
                 interval: float | None = None, stream=None) -> None:
        self.total_bytes = max(int(total_bytes or 0), 0)
        self.enabled = enabled
        self.label = label
        self.stream = sys.stderr if stream is None else stream
        self.records = self.text_bytes = self.tokens = self.input_bytes = 0
        self.start = time.monotonic()
        self._bar = None
        self._closed = not enabled
        if not enabled:
            self.interval = 0.0
            self._next = float("inf")
            return
        terminal = _is_terminal(self.stream)
        if interval is None:
            interval = TERMINAL_INTERVAL if terminal else _interval_from_env()
        self.interval = float(interval)
        self._next = self.start + self.interval
        if terminal:
            self._bar = _make_bar(self.total_bytes, label, self.stream)

    def update(self, records: int, text_bytes: int, tokens: int, input_bytes: int = 0) -> None:
        """Adds one chunk's counts. Called per chunk, so it only adds and reads the clock."""
        self.records += records
        self.text_bytes += text_bytes
        self.tokens += tokens
        self.input_bytes += input_bytes
        now = time.monotonic()
        if now >= self._next:
            self._show(now)

    def set(self, records: int, text_bytes: int, tokens: int, input_bytes: int) -> None:
        """Replaces the counts by absolute totals (progress summed over remote workers)."""
        self.records, self.text_bytes = records, text_bytes
        self.tokens, self.input_bytes = tokens, input_bytes
        now = time.monotonic()
        if now >= self._next:
            self._show(now)

    def close(self) -> None:
        """Shows the final counts once; later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        self._next = float("inf")
        now = time.monotonic()
        if self._bar is not None:
            # tqdm's close() draws the bar once more, so only the counts are set here.
            self._bar.set_postfix_str(self._postfix(now), refresh=False)
            self._bar.n = self.input_bytes
            self._bar.close()
        else:
            self._write(self._final_line(now))

    # -- showing ---------------------------------------------------------------------------------

    def _show(self, now: float) -> None:
        # From now, not from the previous deadline: a stalled run prints one line, not a burst.
        self._next = now + self.interval
        if self._bar is not None:
            self._draw_bar(now)
        else:
            self._write(self._line(now))

    def _rates(self, now: float) -> str:
        dt = max(now - self.start, 1e-9)
        return (f"{self.records / dt:,.0f} rec/s {self.text_bytes / dt / 1e6:,.2f} MB/s "
                f"{self.tokens / dt / 1e6:,.2f} Mtok/s")

    def _postfix(self, now: float) -> str:
        return f"{self.records:,} records {self._rates(now)}"

    def _prefix(self) -> str:
        return f"[{self.label}] " if self.label else ""

    def _line(self, now: float) -> str:
        elapsed = now - self.start
        parts = [self._prefix()]
        if self.total_bytes:
            parts.append(f"{min(100.0, 100.0 * self.input_bytes / self.total_bytes):.1f}% ")
        parts.append(f"{self.records:,} records {self._rates(now)} elapsed {_clock(elapsed)}")
        if self.total_bytes and self.input_bytes > 0:
            left = max(self.total_bytes - self.input_bytes, 0)
            parts.append(f" ETA {_clock(elapsed * left / self.input_bytes)}")
        return "".join(parts)

    def _final_line(self, now: float) -> str:
        inputs = f", {self.input_bytes / 1e6:,.2f} MB input" if self.input_bytes else ""
        return (f"{self._prefix()}done: {self.records:,} records, {self.tokens:,} tokens, "
                f"{self.text_bytes / 1e6:,.2f} MB text{inputs} in {_clock(now - self.start)} "
                f"({self._rates(now)})")

    def _write(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()

    def _draw_bar(self, now: float) -> None:
        bar = self._bar
        bar.set_postfix_str(self._postfix(now), refresh=False)
        # Position = input bytes (tqdm's percentage and ETA); update() keeps its smoothed rate.
        delta = self.input_bytes - bar.n
        if delta:
            bar.update(delta)
        else:
            bar.refresh()


def _make_bar(total_bytes: int, label: str, stream):
    # Imported here: runs that log to files, or show nothing, never need it.
    from tqdm import tqdm

    class _Bar(tqdm):
        # No monitor thread: the pipeline forks workers after the bar exists, and forking a
        # process with threads can deadlock. Only this process draws, so a thread lock is enough
        # (tqdm's default also makes a multiprocessing lock, which fixes the start method).
        monitor_interval = 0
        _lock = threading.RLock()

    # The label goes into the format itself, braces escaped, so both layouts start like a log line.
    head = f"[{label}] ".replace("{", "{{").replace("}", "}}") if label else ""
    if total_bytes:
        fmt = head + "{percentage:3.0f}%|{bar}| {n_fmt}{unit}/{total_fmt}{unit} "
        fmt += "[{elapsed}<{remaining}{postfix}]"
    else:
        fmt = head + "{n_fmt}{unit} read [{elapsed}{postfix}]"
    # Progress decides when to draw (_show), so tqdm draws whenever asked: mininterval=0, miniters=1.
    # The bar leaves out tqdm's own B/s: it counts compressed input, and would sit next to text MB/s.
    return _Bar(total=total_bytes or None, file=stream, dynamic_ncols=True, unit="B", unit_scale=True,
                unit_divisor=1000, mininterval=0, miniters=1, bar_format=fmt, leave=True)
