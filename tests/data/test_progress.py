"""qwen_data.run.progress: plain lines in logs, a tqdm bar on terminals, nothing when disabled."""

import io
import re

import pytest

from qwen_data.run import progress as progress_module
from qwen_data.run.progress import Progress


class Clock:
    """A time.monotonic that moves only when told, so intervals and rates are exact."""

    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(progress_module.time, "monotonic", c)
    monkeypatch.delenv(progress_module.INTERVAL_ENV, raising=False)
    return c


def test_log_lines_every_interval_with_percentage_from_input_bytes(clock):
    out = io.StringIO()
    p = Progress(1000, label="tok", interval=10, stream=out)
    p.update(100, 5_000_000, 1_000_000, input_bytes=200)
    assert out.getvalue() == ""  # interval not yet over: nothing formatted or written
    clock.now += 10
    p.update(100, 5_000_000, 1_000_000, input_bytes=220)
    lines = out.getvalue().splitlines()
    # 420 of 1000 input bytes in 10 s: 42%, 20 rec/s, 1 MB/s, 0.2 Mtok/s, 580 bytes left at 42 B/s.
    assert lines == ["[tok] 42.0% 200 records 20 rec/s 1.00 MB/s 0.20 Mtok/s elapsed 0:00:10 ETA 0:00:13"]
    clock.now += 5
    p.update(1, 1, 1, input_bytes=1)
    assert len(out.getvalue().splitlines()) == 1  # 5 s later: still within the interval
    clock.now += 100
    p.close()
    p.close()
    text = out.getvalue()
    assert "\r" not in text and "\033" not in text
    lines = text.splitlines()
    assert len(lines) == 2
    assert lines[1].startswith("[tok] done: 201 records, 2,000,001 tokens, 10.00 MB text")
    assert "in 0:01:55" in lines[1]


def test_interval_zero_prints_each_update_and_the_percentage_ignores_text_bytes(clock):
    out = io.StringIO()
    p = Progress(4000, interval=0, stream=out)
    for _ in range(3):
        clock.now += 1
        p.update(10, 10_000, 100, input_bytes=1000)  # text bytes far above the input: compressed input
    lines = out.getvalue().splitlines()
    assert [re.match(r"(\S+)%", line).group(1) for line in lines] == ["25.0", "50.0", "75.0"]
    assert not lines[0].startswith("[")  # no label, no brackets


def test_default_interval_comes_from_the_environment(clock, monkeypatch):
    monkeypatch.setenv(progress_module.INTERVAL_ENV, "2")
    out = io.StringIO()
    p = Progress(100, stream=out)
    assert p.interval == 2.0
    clock.now += 2
    p.update(1, 1, 1, 1)
    assert len(out.getvalue().splitlines()) == 1
    monkeypatch.delenv(progress_module.INTERVAL_ENV)
    assert Progress(100, stream=io.StringIO()).interval == 30.0
    monkeypatch.setenv(progress_module.INTERVAL_ENV, "soon")
    with pytest.raises(ValueError, match=progress_module.INTERVAL_ENV):
        Progress(100, stream=io.StringIO())


@pytest.mark.parametrize("stream", [io.StringIO, Terminal])
def test_disabled_prints_nothing(clock, stream):
    out = stream()
    p = Progress(1000, enabled=False, label="x", interval=0, stream=out)
    clock.now += 100
    p.update(5, 5, 5, 5)
    p.set(10, 10, 10, 10)
    p.close()
    assert out.getvalue() == ""


def test_set_replaces_the_totals(clock):
    out = io.StringIO()
    p = Progress(1000, interval=0, stream=out)
    p.update(500, 1, 1, input_bytes=900)
    clock.now += 10
    p.set(100, 2_000_000, 3_000_000, 250)
    assert (p.records, p.text_bytes, p.tokens, p.input_bytes) == (100, 2_000_000, 3_000_000, 250)
    last = out.getvalue().splitlines()[-1]
    assert last.startswith("25.0% 100 records 10 rec/s 0.20 MB/s 0.30 Mtok/s elapsed 0:00:10 ETA 0:00:30")


def test_unknown_total_has_no_percentage_nor_eta(clock):
    out = io.StringIO()
    p = Progress(0, label="merge", interval=0, stream=out)
    clock.now += 4
    p.update(8, 4_000_000, 400_000, input_bytes=123)
    p.close()
    text = out.getvalue()
    assert "%" not in text and "ETA" not in text
    assert text.splitlines()[0] == "[merge] 8 records 2 rec/s 1.00 MB/s 0.10 Mtok/s elapsed 0:00:04"


def test_terminal_gets_a_tqdm_bar_with_the_postfix(clock):
    out = Terminal()
    p = Progress(1000, label="tok", interval=0, stream=out)
    clock.now += 2
    p.update(4_000, 6_000_000, 2_000_000, input_bytes=500)
    drawn = out.getvalue()
    assert "\r" in drawn  # tqdm redraws in place
    assert " 50%|" in drawn and "[tok]" in drawn
    assert "4,000 records 2,000 rec/s 3.00 MB/s 1.00 Mtok/s" in drawn
    p.close()
    assert out.getvalue().endswith("\n")


def test_terminal_with_unknown_total_is_a_counter(clock):
    out = Terminal()
    p = Progress(0, interval=0, stream=out)
    clock.now += 1
    p.update(7, 1_000_000, 1_000_000, input_bytes=2_000)
    p.close()
    text = out.getvalue()
    assert "%" not in text
    assert "2.00kB read" in text and "7 records 7 rec/s 1.00 MB/s 1.00 Mtok/s" in text


def test_terminal_bar_is_redrawn_at_most_every_interval(clock):
    out = Terminal()
    p = Progress(1000, interval=0.5, stream=out)
    before = out.getvalue()
    for _ in range(50):
        p.update(1, 1, 1, input_bytes=1)  # no time passes: no redraw
    assert out.getvalue() == before
    clock.now += 0.5
    p.update(1, 1, 1, input_bytes=1)
    assert "51 records" in out.getvalue()
    p.close()
