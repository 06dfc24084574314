"""`qwen-data`'s entry point: numpy's BLAS threads held to one, then a certified run's checking process
forked (`run.prestart`), before the CLI's own imports, then the CLI; once it has returned, the process ends
without the interpreter's teardown (`_end_now`)."""

import atexit
import os
import sys

# numpy's OpenBLAS starts a thread per core when numpy is imported, and each spins ~0.1 s before it sleeps: on a
# 16-core host, 15 threads and ~1.8 CPU s in every process that imports numpy after its fork (the checking process
# among them), taken from the workers as they start. The data side makes no BLAS call; `train` may, so its
# processes (torchrun's) keep the default, as does any value the user set.
BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "1")
# Commands that are not data commands: BLAS threads as numpy starts them, and an end as Python's (torch's and
# NCCL's teardown are theirs).
NOT_DATA = ("train",)
_returned: list[int] = []  # the exit status of a data command that has returned (`_end_now`)


def _is_data(argv: list[str]) -> bool:
    """Whether `argv` (the command line after `qwen-data`) runs a data command."""
    return next((a for a in argv if not a.startswith("-")), None) not in NOT_DATA


def quiet_blas(argv: list[str]) -> None:
    """One BLAS thread for a data command, before numpy loads."""
    if _is_data(argv):
        os.environ.setdefault(*BLAS_THREADS)


def _end_now() -> None:
    """The last exit handler (registered before any other, so run after them all: multiprocess's, which
    ends the workers, logging's): once a data command has returned, the process ends here, its output
    flushed, before the interpreter frees every object a run made one by one (the tokenizer's tables,
    arrays, modules: 0.05 s after a one-document run's last line, 0.15-0.2 s after a 2 GB one's). Other threads
    have been joined before exit handlers run; a command that raised ends as Python ends it."""
    if not _returned:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # (a reader gone, a stream closed: nothing more can be said)
            pass
    os._exit(_returned[0])


def main() -> int:
    argv = sys.argv[1:]
    atexit.register(_end_now)
    quiet_blas(argv)
    from .run.prestart import prestart

    prestart(argv)
    from .cli import main as cli_main

    code = cli_main()
    if _is_data(argv):
        _returned.append(code if isinstance(code, int) else 0 if code is None else 1)
    return code
