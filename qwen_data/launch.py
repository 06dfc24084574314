"""`qwen-data`'s entry point: a certified run's checking process forked first (`run.prestart`),
before the CLI's own imports, then the CLI."""

import sys


def main() -> int:
    from .run.prestart import prestart

    prestart(sys.argv[1:])
    from .cli import main as cli_main

    return cli_main()
