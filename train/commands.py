"""The train stage's commands, `qwen-data train` and `qwen-data convert` (`python -m qwen_data_train`,
torchrun alike): the options are parsed, and `--help` or a refused option answered, before torch and
megatron-core are imported."""

from __future__ import annotations

import os
import sys
from typing import Optional

from qwen_data.errors import describe

from .config import TrainConfig, convert_parser


def main(argv: Optional[list[str]] = None) -> int:
    """`python -m qwen_data_train` (what torchrun runs): `train`, its refusals (a bad blend weight, a
    corrupt index: ValueErrors; a file it cannot open) told in the one line `qwen-data train` says,
    with the rank where there are several, and exit status 2. Anything else keeps its traceback."""
    try:
        return train(argv)
    except (ValueError, OSError) as exc:
        if isinstance(exc, OSError) and not exc.filename:  # a failure, not a path the user gave
            raise
        ranks = int(os.environ.get("WORLD_SIZE", "1"))
        who = f"rank {os.environ.get('RANK', '?')}" if ranks > 1 else "qwen-data train"
        print(f"{who}: error: {describe(exc)}", file=sys.stderr)
        return 2


def train(argv: Optional[list[str]] = None) -> int:
    config = TrainConfig.parse(argv)
    from .loop import train as run

    return run(config)


def convert(argv: Optional[list[str]] = None) -> int:
    args = convert_parser().parse_args(argv)
    from .convert import convert as run

    return run(args)
