"""Workers end with the main process, at once and quietly: killed (SIGKILL), interrupted (Ctrl-C) or
terminated (SIGTERM)."""

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from qwen_data.cli import main

from qwen_data.run.workers import WorkerError, ordered_map

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INTERRUPTED = "interrupted: no output was committed"
TERMINATED = "terminated (SIGTERM): no output was committed"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """~12 MB of text: the hf backend tokenizes ~1 MB/s per worker, so this lasts several seconds."""
    rng = random.Random(0)
    words = ["alpha", "beta", "données", "模型", "token", "Qwen", "the", "of", "and", "数据"]
    path = tmp_path_factory.mktemp("corpus") / "big.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(6000):
            text = " ".join(f"{w}{rng.randint(0, 999)}" for w in rng.choices(words, k=250))
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    return str(path)


def as_a_shell_starts_it():
    """A command as a terminal's shell starts it: Ctrl-C and SIGTERM at their defaults, none held back.
    (A child inherits an ignored or blocked signal: a pytest process that an earlier test left so, in the
    full suite, made every Ctrl-C here a no-op.)"""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def start_pretrain(corpus, prefix, stderr, chunk_mb):
    # its own session, so a signal to its process group (what a terminal's Ctrl-C does) spares pytest
    proc = subprocess.Popen(
        [sys.executable, "-m", "qwen_data.cli", "pretrain", corpus, "-o", str(prefix), "--workers", "2",
         "--backend", "hf", "--chunk-mb", str(chunk_mb), "--quiet"],
        cwd=REPO, stderr=stderr, stdout=subprocess.DEVNULL, start_new_session=True, preexec_fn=as_a_shell_starts_it,
    )
    main = psutil.Process(proc.pid)
    deadline = time.time() + 60
    while time.time() < deadline and len(main.children(recursive=True)) < 2:
        time.sleep(0.05)
    time.sleep(1.0)  # the workers are at work
    workers = main.children(recursive=True)
    # 2, or 3 while a worker that did its share of tasks hands over to a fresh one
    assert len(workers) >= 2 and proc.poll() is None, "run ended before it could be stopped: make the input bigger"
    return proc, workers


def group(pgid):
    """Every process still running in the process group (the run's session)."""
    members = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                members.append(p.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return members


def alive(processes):
    def running(p):
        try:
            return p.status() != psutil.STATUS_ZOMBIE  # orphans may stay zombies where pid 1 does not reap
        except psutil.NoSuchProcess:
            return False

    return [p.pid for p in processes if running(p)]


def wait_gone(processes, seconds):
    deadline = time.time() + seconds
    while alive(processes) and time.time() < deadline:
        time.sleep(0.02)
    return alive(processes)


def end_group(pgid):
    """Whatever a failing run left behind (its session is its process group)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_killed_main_process_takes_its_workers_at_once(tmp_path, corpus):
    with open(tmp_path / "stderr", "w+") as err:
        # 2 MB chunks: a worker needs ~2 s per chunk, so only dying at once passes
        proc, workers = start_pretrain(corpus, tmp_path / "out", err, chunk_mb=2)
        try:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            assert wait_gone(workers, 1.0) == [], "workers outlived the killed main process by over 1 s"
            assert group(proc.pid) == []
            time.sleep(0.2)  # anything a dying worker printed is in the file by now
            err.seek(0)
            text = err.read()
        finally:
            end_group(proc.pid)
    assert "Traceback" not in text and "BrokenPipeError" not in text, text
    assert not os.path.exists(tmp_path / "out.json")


def test_ctrl_c_ends_everything_quietly(tmp_path, corpus):
    with open(tmp_path / "stderr", "w+") as err:
        # small chunks: workers spend time in Python code, where a KeyboardInterrupt would strike
        proc, workers = start_pretrain(corpus, tmp_path / "out", err, chunk_mb=0.05)
        try:
            # A terminal's Ctrl-C reaches every process of the foreground group, in no set order:
            # the workers first here, then the whole group.
            for worker in workers:
                os.kill(worker.pid, signal.SIGINT)
            time.sleep(0.5)
            os.killpg(proc.pid, signal.SIGINT)
            assert proc.wait(timeout=10) == 130
            assert wait_gone(workers, 1.0) == []
            assert group(proc.pid) == []
            err.seek(0)
            assert err.read().splitlines() == [INTERRUPTED]
        finally:
            end_group(proc.pid)
    for ext in (".json", ".bin", ".idx"):
        assert not os.path.exists(f"{tmp_path / 'out'}{ext}")


@pytest.mark.slow  # the resumed run reads the corpus through HF: ~20 s
@pytest.mark.parametrize("to", ["main", "group"])
def test_sigterm_cleans_up_as_ctrl_c_does(tmp_path, corpus, to):
    """SIGTERM, from `kill` (the main process) or from `timeout` or a scheduler (the whole group),
    ends the run as Ctrl-C does: workers gone, no lock left, one line, status 143 (128 + SIGTERM);
    its staged files and journal stay, and the same command run again resumes from them and leaves
    nothing else behind. (It used to end the process where it stood, .lock files left behind.)"""
    out = tmp_path / "out"
    out.mkdir()
    with open(tmp_path / "stderr", "w+") as err:
        proc, workers = start_pretrain(corpus, out / "web", err, chunk_mb=0.05)
        try:
            assert any(name.endswith(".tmp") for name in os.listdir(out)), os.listdir(out)
            if to == "main":
                os.kill(proc.pid, signal.SIGTERM)
            else:
                os.killpg(proc.pid, signal.SIGTERM)
            assert proc.wait(timeout=10) == 143
            assert wait_gone(workers, 1.0) == []
            assert group(proc.pid) == []
            err.seek(0)
            assert err.read().splitlines() == [TERMINATED]
        finally:
            end_group(proc.pid)
    left = os.listdir(out)
    assert "web.journal" in left and all(name.endswith((".tmp", ".lengths", ".docends", ".journal")) for name in left)
    assert main(["pretrain", corpus, "-o", str(out / "web"), "--workers", "2", "--backend", "hf", "--chunk-mb",
                 "0.05", "--quiet"]) == 0
    assert sorted(os.listdir(out)) == ["web.bin", "web.idx", "web.json"]


STRESS = textwrap.dedent(
    """
    import os, random, signal, sys, threading, time
    import psutil
    from qwen_data.run.workers import ordered_map

    def double(x):
        return 2 * x

    def ctrl_c(delay):
        time.sleep(delay)
        os.kill(os.getpid(), signal.SIGINT)

    rng, me, leaked, interrupted = random.Random(0), psutil.Process(), set(), 0
    for _ in range(40):
        # Ctrl-C at a random moment of the map's life: forking workers, running, tearing down
        poke = threading.Thread(target=ctrl_c, args=(rng.uniform(0, 0.03),))
        try:
            poke.start()
            assert list(ordered_map(double, range(200), 2, tasks_per_worker=5)) == list(range(0, 400, 2))
            poke.join()
        except KeyboardInterrupt:
            interrupted += 1
        poke.join()
        time.sleep(0.05)
        leaked |= {p.pid for p in me.children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}
    for pid in leaked:
        os.kill(pid, signal.SIGKILL)
    print(interrupted, len(leaked), flush=True)
    os._exit(0)  # leaked workers would make the normal exit wait for them
    """
)


def test_ctrl_c_at_any_moment_leaves_no_worker_behind():
    """A KeyboardInterrupt while the pool forked its workers used to leave workers nobody ended
    (and could hang the run)."""
    proc = subprocess.Popen([sys.executable, "-c", STRESS], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=as_a_shell_starts_it)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        end_group(proc.pid)
    assert proc.returncode == 0, err[-3000:]
    interrupted, leaked = map(int, out.split())
    assert leaked == 0 and interrupted == 40
    assert "Traceback" not in err, err[-3000:]


def test_a_worker_that_dies_fails_the_map_instead_of_hanging():
    """multiprocessing.Pool waits forever for the task of a worker killed by the OOM killer."""

    def die_at_seven(x):
        if x == 7:
            os.kill(os.getpid(), signal.SIGKILL)
        return x

    def hung(signum, frame):
        raise TimeoutError("ordered_map hung on a dead worker")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    try:
        with pytest.raises(WorkerError, match=r"exit code -9"):
            list(ordered_map(die_at_seven, range(40), 2, tasks_per_worker=5))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert psutil.Process().children() == []


def test_an_exception_in_a_task_is_raised_in_the_main_process_with_its_traceback():
    def inverse(x):
        return 1 // (x - 11)

    with pytest.raises(ZeroDivisionError) as info:
        list(ordered_map(inverse, range(40), 2, tasks_per_worker=3))
    assert "in inverse" in str(info.value.__cause__)
    assert psutil.Process().children() == []
