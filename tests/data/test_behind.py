"""`formats.indexed.Behind`: calls run in order by a thread of their own (an SFT run's rows written behind
the main thread where no worker takes them, a side process's messages), every one ended
before the process forks, an error raised where the caller next asks."""

import os
import threading
import time

import pytest

from qwen_data.formats.indexed import Behind, pause_threads
from qwen_data.formats.digest import BinDigest


def test_calls_run_in_order_behind_the_caller():
    behind, done = Behind(), []
    gate = threading.Event()

    def call(k):
        gate.wait()
        done.append(k)

    for k in range(3):
        behind.submit(call, k)  # (none waits for the one before)
    assert done == []
    gate.set()
    behind.close()
    assert done == [0, 1, 2]


def test_an_error_is_raised_where_the_caller_asks_next_and_later_calls_are_skipped():
    behind, done = Behind(), []

    def fail():
        raise OSError("disk full")

    behind.submit(fail)
    behind.submit(done.append, 1)
    with pytest.raises(OSError, match="disk full"):
        behind.pause()
    assert done == []
    with pytest.raises(OSError, match="disk full"):
        behind.submit(done.append, 2)
    behind.close(failed=True)  # the error is not wanted any more


def test_calls_submitted_from_another_thread_while_paused_are_all_run(tmp_path):
    """A call of one `Behind` submits to a second, while this process pauses the second again and again
    (as `pause_threads` does before every fork): no call is lost, and once every one is paused no thread
    runs."""
    path = tmp_path / "f.bin"
    with open(path, "wb", buffering=0) as f:
        digest, hashing = BinDigest(), Behind()
        layout = Behind()

        def lay_out(data):
            f.write(data)
            hashing.submit(digest.update, data)
            time.sleep(0.001)

        for k in range(200):
            layout.submit(lay_out, bytes([k]) * 10_000)
            hashing.pause()
        pause_threads()
        assert not layout.running and not hashing.running  # no thread of theirs runs at the fork
        expected = BinDigest()
        expected.update(b"".join(bytes([k]) * 10_000 for k in range(200)))
        hashing.pause()
        assert digest.hexdigest() == expected.hexdigest()
        layout.close()
        hashing.close()
    assert os.path.getsize(path) == 2_000_000
