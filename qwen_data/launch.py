"""`qwen-data`'s entry point: numpy's BLAS threads held to one, then a certified run's checking process
forked (`run.prestart`), before the CLI's own imports, then the CLI."""

import os
import sys

# numpy's OpenBLAS starts a thread per core when numpy is imported, and each spins ~0.1 s before it sleeps: on a
# 16-core host, 15 threads and ~1.8 CPU s in every process that imports numpy after its fork (the checking process
# among them), taken from the workers as they start. The data side makes no BLAS call; `train` may, so its
# processes (torchrun's) keep the default, as does any value the user set.
BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "1")
KEEPS_BLAS = ("train",)


def quiet_blas(argv: list[str]) -> None:
    """One BLAS thread for a data command (`argv`: the command line after `qwen-data`), before numpy loads."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in KEEPS_BLAS:
        os.environ.setdefault(*BLAS_THREADS)


def main() -> int:
    quiet_blas(sys.argv[1:])
    from .run.prestart import prestart

    prestart(sys.argv[1:])
    from .cli import main as cli_main

    return cli_main()
