"""A certified run's checking process, forked as the `qwen-data` command starts (`qwen_data.launch`).

A certified `pretrain` or `sft` checks its sample against HF `tokenizers`, whose Qwen tokenizer
takes ~0.45 s to load: longer than a one-document run's whole work (~0.4 s). Forked by the
run itself (`run.certifier`), it started after the CLI's imports and planning (~0.1 s) and the run
waited for it at the end. Forked here, before any of those, from a module that imports nothing
heavy, it loads while the run imports, plans and works; the run adopts it (`take`).

Only where the command line alone names the tokenizer.json (the bundled one, or a --tokenizer
folder holding one) and asks for the certificate; elsewhere the run forks its own, as before. A
checking process the run does not adopt (another tokenizer, no certificate after all) is killed
when the run starts, and ends with this process whatever happens before (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import os
import signal
import socket

from ..text.bundled import bundled_tokenizer_dir
from .lifetime import STOPPING, die_with

COMMANDS = ("pretrain", "sft")  # the commands that certify what they write
# Inputs of more bytes than this hold more records than a trimmed reference is for (`checks.TRIM_RECORDS`), but
# for records of 16 KB and more, which then load the trimmed tables when they are first checked.
LARGE_INPUT_BYTES = 1 << 20
_prestarted: tuple[int, socket.socket, str] | None = None  # (pid, our end, tokenizer.json) until taken


def prestart(argv: list[str]) -> None:
    """Fork the checking process where `argv` asks for a certified run of a known tokenizer.json."""
    global _prestarted
    path = _tokenizer_json(argv)
    if path is None or _prestarted is not None:
        return
    ours, theirs = socket.socketpair()
    parent = os.getpid()
    # Ctrl-C and SIGTERM held back across the fork: the child ignores them before they can reach it
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING)
    pid = os.fork()
    if pid == 0:  # the checking process: never returns
        ours.close()
        _check_here(theirs, parent, path, held, whole=_command(argv) == "sft" or large(argv))
    signal.pthread_sigmask(signal.SIG_SETMASK, held)
    theirs.close()
    _prestarted = (pid, ours, path)


def take(tokenizer_json: str | None) -> tuple[int, socket.socket] | None:
    """The prestarted checking process (its pid and our end of its socket) where it loads
    `tokenizer_json`; None where there is none, or it loads another (then it is killed, as it is
    where `tokenizer_json` is None: the run checks nothing, or here)."""
    global _prestarted
    if _prestarted is None:
        return None
    pid, ours, path = _prestarted
    _prestarted = None
    if tokenizer_json is not None and os.path.realpath(tokenizer_json) == os.path.realpath(path):
        return pid, ours
    ours.close()
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
    return None


def _command(argv: list[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def _tokenizer_json(argv: list[str]) -> str | None:
    """The tokenizer.json a certified pretrain or sft `argv` encodes with, where the command line
    alone says (the CLI decides everything else; a guess that proves wrong costs a killed process)."""
    if _command(argv) not in COMMANDS or {"--no-certify", "-h", "--help"} & set(argv):
        return None
    values = {}
    for k, arg in enumerate(argv):
        name, equals, value = arg.partition("=")
        if name in ("--tokenizer", "--executor"):
            values[name] = value if equals else (argv[k + 1] if k + 1 < len(argv) else "")
    if values.get("--executor", "local") != "local":
        return None
    folder = values.get("--tokenizer") or bundled_tokenizer_dir()
    if folder is None or not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        return None  # a Hub name: where its cache lies is the CLI's to find
    return os.path.join(os.path.abspath(folder), "tokenizer.json")


def large(paths: list[str]) -> bool:
    """Whether the files of `paths` (a command line's words, a run's inputs) hold more than LARGE_INPUT_BYTES
    (folders and globs not looked into): a guess that proves wrong costs the checking process a load, never
    a wrong check."""
    sizes = (os.path.getsize(a) for a in paths if not a.startswith("-") and os.path.isfile(a))
    return sum(sizes) > LARGE_INPUT_BYTES


def _check_here(sock: socket.socket, parent: int, path: str, mask: set, whole: bool) -> None:
    """The checking process: HF's tokenizer loaded first (the long part; for pretraining on small inputs,
    only the tables it is cut down from, `certify.trimmed`: a run of few records needs no more, where
    loading them before the whole tokenizer took a large run's checking process ~0.6 s more), then the
    run's checks served as `run.certifier` serves them in the processes it forks."""
    status = 0
    try:
        for signum in STOPPING:  # the run decides, then kills us
            signal.signal(signum, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # the run's standard input is the run's (as multiprocess does)
        die_with(parent)
        from tokenizers import Tokenizer

        loaded = None
        try:
            if whole:
                loaded = Tokenizer.from_file(path)
            else:
                from ..certify import trimmed

                trimmed.tables(path)
        except Exception:  # the run's own request to load it says why, in the run
            pass
        from multiprocess.connection import Connection

        from ..certify.reference import hold
        from ..certify.checks import check_in_side
        from .workers import serve

        if loaded is not None:
            hold(path, loaded)
        serve(Connection(sock.detach()), parent, check_in_side, (), None, 0)
    except BaseException:
        import traceback

        traceback.print_exc()
        status = 1
    finally:
        os._exit(status)  # never back into the CLI this process was forked from
