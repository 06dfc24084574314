"""The command line's help: every command's `--help` answers without importing torch or megatron-core
(the train stage imports them only when it runs), and states the default of every option.
(That train runs print no dependency warnings is checked on every run of `_train.run`.)"""

import argparse
import json
import subprocess
import sys

from qwen_data_train.config import build_parser as train_parser
from qwen_data_train.config import convert_parser

from qwen_data.cli import build_parser
from qwen_data.options import says_default


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def _all_parsers() -> dict[str, argparse.ArgumentParser]:
    """Each parser whose --help a user sees; train and convert answer with the train stage's own."""
    parsers = {"": build_parser()} | dict(_subcommands(build_parser()))
    parsers["train"] = train_parser()
    parsers["convert"] = convert_parser()
    parsers |= {f"convert {name}": p for name, p in _subcommands(convert_parser()).items()}
    return parsers


HELP_RUNNER = """
import contextlib, io, json, sys
from qwen_data.cli import main
helps = {}
for command in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main(command.split() + ["--help"])
        except SystemExit:
            pass
    helps[command] = out.getvalue()
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "megatron", "transformers"))
print(json.dumps({"helps": helps, "heavy": heavy}))
"""


def test_help_imports_neither_torch_nor_megatron():
    commands = [name for name in _all_parsers() if name]
    assert {"pretrain", "sft", "merge", "blend", "verify", "inspect", "stats", "train", "convert",
            "convert hf-to-mcore", "convert mcore-to-hf"} <= set(commands)
    done = subprocess.run([sys.executable, "-c", HELP_RUNNER, json.dumps(commands)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    result = json.loads(done.stdout)
    assert result["heavy"] == []
    helps = result["helps"]
    for command in commands:
        assert helps[command].startswith(f"usage: qwen-data {command} "), command
    # train and convert answer with the train stage's options, defaults shown.
    assert "--seq-length SEQ_LENGTH" in helps["train"] and "(default: 4096)" in helps["train"]
    assert "(default: 1)" in helps["convert hf-to-mcore"]


def test_every_option_shows_its_default():
    """An option that takes a value shows "(default: X)" or says in its help what happens without it;
    a flag is off unless given, a required option has none."""
    checked = 0
    for name, parser in _all_parsers().items():
        formatter = parser._get_formatter()
        for action in parser._actions:
            pair = isinstance(action, argparse.BooleanOptionalAction)  # --X / --no-X: says which is the default
            if not action.option_strings or action.nargs == 0 and not pair or action.required:
                continue
            text = formatter._expand_help(action) if action.help else ""
            assert says_default(text) and "(default: None)" not in text, f"qwen-data {name} {action.option_strings}"
            checked += 1
    assert checked > 80
