"""The train stage's commands, `qwen-data train` and `qwen-data convert` (`python -m qwen_data_train`,
torchrun alike): the options are parsed, and `--help` or a refused option answered, before torch and
megatron-core are imported."""

from __future__ import annotations

from typing import Optional

from .config import TrainConfig, convert_parser


def train(argv: Optional[list[str]] = None) -> int:
    config = TrainConfig.parse(argv)
    from .loop import train as run

    return run(config)


def convert(argv: Optional[list[str]] = None) -> int:
    args = convert_parser().parse_args(argv)
    from .convert import convert as run

    return run(args)
