"""The checking process forked as `qwen-data` starts (`qwen_data.run.prestart`): adopted by the certified
run it was forked for, killed where the run does not take it, gone with the command."""

import os
import signal
import subprocess
import sys
import time

import pytest
from _helpers import manifest, write_jsonl

from qwen_data.run import prestart
from qwen_data.text.bundled import bundled_tokenizer_dir

BUNDLED = os.path.join(bundled_tokenizer_dir(), "tokenizer.json")


def _gone(pid: int, seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)  # our child: reaped here
        except ChildProcessError:  # not ours: ask the kernel whether it still runs
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
        else:
            if done:
                return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("argv, expected", [
    (["pretrain", "c.jsonl", "-o", "o"], BUNDLED),
    (["sft", "c.jsonl", "--template", "qwen3"], BUNDLED),
    (["--quiet", "pretrain", "c.jsonl"], BUNDLED),
    (["pretrain", "c.jsonl", "--tokenizer", "{dir}"], "{dir}/tokenizer.json"),
    (["pretrain", "c.jsonl", "--tokenizer={dir}"], "{dir}/tokenizer.json"),
    (["pretrain", "c.jsonl", "--no-certify"], None),
    (["pretrain", "--help"], None),
    (["verify", "o"], None),
    (["pretrain", "c.jsonl", "--executor", "ray"], None),
    (["pretrain", "c.jsonl", "--tokenizer", "Qwen/Qwen2.5-7B"], None),  # a Hub name: the CLI finds its cache
    (["pretrain", "c.jsonl", "--tokenizer", "{dir}/missing"], None),
])
def test_the_command_line_alone_says_which_tokenizer_to_load(tmp_path, argv, expected):
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{}")
    argv = [a.replace("{dir}", str(folder)) for a in argv]
    expected = expected and expected.replace("{dir}", str(folder))
    assert prestart._tokenizer_json(argv) == expected


def test_a_checker_the_run_does_not_take_is_killed(monkeypatch):
    monkeypatch.setattr(prestart, "_prestarted", None)
    prestart.prestart(["pretrain", "c.jsonl"])
    pid, _, path = prestart._prestarted
    assert path == BUNDLED
    assert prestart.take("/elsewhere/tokenizer.json") is None and prestart._prestarted is None
    assert _gone(pid)


ADOPTING = """
import sys
from qwen_data.run import prestart
from qwen_data.text.bundled import bundled_tokenizer_dir
from qwen_data.run import workers

taken = []
original = workers.SideProcess.__init__
def recording(self, fn, forked=None):
    taken.append(forked is not None)
    original(self, fn, forked)
workers.SideProcess.__init__ = recording

prestart.prestart(sys.argv[1:])
pid = prestart._prestarted[0]
from qwen_data.cli import main
status = main(sys.argv[1:])
print("adopted", taken, pid, flush=True)
sys.exit(status)
"""


def test_the_certified_run_adopts_the_checker_and_ends_it(tmp_path):
    data = write_jsonl(tmp_path / "c.jsonl", [{"text": "One small document, checked by HF's tokenizer."}])
    run = subprocess.run([sys.executable, "-c", ADOPTING, "pretrain", data, "-o", str(tmp_path / "o"), "--quiet"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    words = next(line for line in run.stdout.splitlines() if line.startswith("adopted")).split()
    assert words[:2] == ["adopted", "[True]"], run.stdout  # the one checking process: the one forked first
    assert _gone(int(words[2]))
    certificate = manifest(tmp_path / "o")["certificate"]
    assert certificate["certified"] is True and certificate["records_checked"] == 1


def test_the_checker_ends_with_a_killed_command(tmp_path):
    script = ("import os, signal, sys\nfrom qwen_data.run import prestart\nprestart.prestart(['pretrain', 'c.jsonl'])\n"
              "print(prestart._prestarted[0], flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == -signal.SIGKILL
    assert _gone(int(run.stdout.split()[0]))


def test_python_m_qwen_data_is_the_command(tmp_path):
    data = write_jsonl(tmp_path / "c.jsonl", [{"text": "Hello."}])
    run = subprocess.run([sys.executable, "-m", "qwen_data", "pretrain", data, "-o", str(tmp_path / "o"), "--quiet"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert manifest(tmp_path / "o")["certificate"]["certified"] is True


def test_inputs_past_a_megabyte_are_large_and_folders_are_not_looked_into(tmp_path):
    small, big = tmp_path / "small.jsonl", tmp_path / "big.jsonl"
    small.write_bytes(b"x" * 1000)
    big.write_bytes(b"x" * (prestart.LARGE_INPUT_BYTES + 1))
    assert not prestart.large(["pretrain", str(small), "-o", "o", "--workers", "2"])
    assert prestart.large(["pretrain", str(small), str(big), "-o", "o"])
    assert not prestart.large([str(tmp_path), str(tmp_path / "*.jsonl"), "-"])


def test_the_checker_loads_the_whole_tokenizer_for_sft_and_large_inputs(tmp_path, monkeypatch):
    small, big = tmp_path / "small.jsonl", tmp_path / "big.jsonl"
    small.write_bytes(b"x" * 1000)
    big.write_bytes(b"x" * (prestart.LARGE_INPUT_BYTES + 1))
    loads = []

    class Forked(Exception):
        pass

    def checking(sock, parent, path, held, whole):  # the child's side, run here: what it was told to load
        loads.append(whole)
        sock.close()
        raise Forked

    monkeypatch.setattr(prestart, "_check_here", checking)
    monkeypatch.setattr(os, "fork", lambda: 0)  # prestart takes the child's branch in this process
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    try:
        for argv in (["pretrain", str(big)], ["pretrain", str(small)], ["sft", str(small), "--template", "qwen3"]):
            monkeypatch.setattr(prestart, "_prestarted", None)
            with pytest.raises(Forked):
                prestart.prestart(argv)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # (the child's branch leaves Ctrl-C held)
    assert loads == [True, False, True]


def test_a_large_input_of_few_records_is_certified(tmp_path):
    # guessed large (HF's whole tokenizer loaded at once), though its 3 records would have a trimmed reference
    text = "word " * (prestart.LARGE_INPUT_BYTES // 4)
    data = write_jsonl(tmp_path / "c.jsonl", [{"text": text}, {"text": "A second document."}, {"text": text[:999]}])
    assert prestart.large([data])
    run = subprocess.run([sys.executable, "-c", ADOPTING, "pretrain", data, "-o", str(tmp_path / "o"), "--quiet"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "adopted [True]" in run.stdout
    certificate = manifest(tmp_path / "o")["certificate"]
    assert certificate["certified"] is True and certificate["records_checked"] == 3


def test_a_run_asks_its_checker_for_what_prestart_would_load(tmp_path, monkeypatch):
    from qwen_data.run import pipeline
    from qwen_data.steps.pretrain import PretrainConfig, run

    asked = []
    early = pipeline.Certifier.early

    def recording(tokenizer_json, count=1, whole=True):
        asked.append(whole)
        return early(tokenizer_json, count, whole)

    monkeypatch.setattr(pipeline.Certifier, "early", staticmethod(recording))
    text = "word " * (prestart.LARGE_INPUT_BYTES // 4)
    small = write_jsonl(tmp_path / "small.jsonl", [{"text": "A document."}])
    big = write_jsonl(tmp_path / "big.jsonl", [{"text": text}, {"text": "A second document."}])
    for data in (small, big):
        run(PretrainConfig(inputs=[data], output_prefix=str(tmp_path / os.path.basename(data)), workers=1,
                           quiet=True))
    assert asked == [False, True]


NUMPY_THREADS = """
import os, sys
from qwen_data.launch import quiet_blas
quiet_blas(sys.argv[1:])
import numpy, time
time.sleep(0.05)
print(len(os.listdir("/proc/self/task")))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="OpenBLAS starts no thread of its own on one core")
@pytest.mark.parametrize("argv, threads", [(["pretrain", "c.jsonl"], 1), (["--quiet", "sft", "c.jsonl"], 1),
                                            (["train", "--config", "c.yaml"], "more")])
def test_a_data_command_s_numpy_starts_no_blas_threads(argv, threads):
    """numpy's OpenBLAS, imported after `launch.quiet_blas`, starts no thread for a data command (each of its
    threads per core spins ~0.1 s on import); `train` keeps them."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    found = int(subprocess.run([sys.executable, "-c", NUMPY_THREADS, *argv], env=env, capture_output=True,
                               text=True, check=True).stdout)
    assert found == 1 if threads == 1 else found > 1


def test_on_a_fresh_machine_the_checking_process_leaves_the_spelling_table_cached(tmp_path, monkeypatch):
    """The checking process's first step derives the tokenizer's spelling table where the cache lacks it,
    so a fresh machine's run finds it there (its main process derived it itself, before its workers
    started)."""
    from qwen_data.certify.checks import check_in_side
    from qwen_data.certify.spelling import Spelling
    from qwen_data.text.tokenizer import QwenTokenizer

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    tokenizer = QwenTokenizer()
    table = tokenizer._cache_path("spelling.npy")
    assert not os.path.exists(table)
    check_in_side(("load", BUNDLED, False))
    assert os.path.exists(table)
    built = Spelling.of(tokenizer)
    assert built.flat.tobytes() == Spelling.from_json(tokenizer._json_text, tokenizer.added_tokens,
                                                      tokenizer.vocab_size).flat.tobytes()
