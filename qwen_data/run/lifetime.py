"""How a run's processes end with it: the signals the main process decides on, and a child that
dies with its parent."""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
STOPPING = (signal.SIGINT, signal.SIGTERM)  # what the main process acts on for its processes (they ignore them)


def die_with(parent: int) -> None:
    """Make this process end when `parent` does (PR_SET_PDEATHSIG fires when the forking thread
    ends: here always the main thread, which outlives the run)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        prctl = None
    if prctl is not None and prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)
        return
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.1)
    os._exit(1)
