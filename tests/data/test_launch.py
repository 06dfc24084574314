"""`qwen-data`'s entry point (`qwen_data.launch`): a data command that has returned ends its process after
every exit handler, its output flushed and its exit status kept, without the interpreter's teardown;
`train`, and a command that raised, end as Python ends them."""

import subprocess
import sys

import pytest
from _helpers import write_jsonl

# The command line's words after `qwen-data`, then: an object only the interpreter's teardown frees, an exit
# handler registered once the command returned (so run before launch's), and output left in stdout's buffer.
ENTRY = """
import atexit, os, sys
from qwen_data import launch


class Held:
    def __del__(self, write=os.write):  # (module globals may be gone by then)
        write(2, b"torn down\\n")


held = Held()
sys.argv = ["qwen-data", *sys.argv[1:]]
code = launch.main()
atexit.register(lambda: sys.stderr.write("exit handler ran\\n"))
sys.stdout.write("x" * 100_000)
sys.exit(code)
"""


def _entry(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", ENTRY, *argv], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("case, status", [("written", 0), ("missing input", 2)])
def test_a_data_command_ends_after_its_exit_handlers_without_teardown(tmp_path, case, status):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": "One document."}])
    given = corpus if case == "written" else str(tmp_path / "missing.jsonl")
    done = _entry("pretrain", given, "-o", str(tmp_path / "o"), "--quiet")
    assert done.returncode == status, done.stderr
    assert done.stdout.endswith("x" * 100_000)
    assert "exit handler ran" in done.stderr
    assert "torn down" not in done.stderr
    assert (tmp_path / "o.bin").exists() == (case == "written")


def test_train_ends_as_python_ends(tmp_path):
    done = _entry("train", "--data", str(tmp_path / "missing.json"))
    assert done.returncode == 2 and "no such blend file" in done.stderr, done.stderr
    assert done.stdout.endswith("x" * 100_000)
    assert "exit handler ran" in done.stderr and "torn down" in done.stderr
