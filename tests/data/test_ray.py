"""`--executor ray`: shards as Ray tasks, merged into exactly the bytes of one local run.

One local Ray instance (2 CPUs) serves the whole module; the runs join it (`run_on_ray` uses the
instance this process already has). A killed task is made deterministic without any hook in
qwen-data: the run is given a `run` (a test function) whose progress object holds shard 1's first
attempt after its first chunk, the task then found through /proc as the process holding the
shard's output lock, and killed. A stopped driver (the runs that resume by shard) is a KeyboardInterrupt
raised where the driver saves a finished shard's picked records (`kept.keep_picked`) or merges.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import signal
import threading
import time

import pytest
from _helpers import chats, corpus, manifest, pretrain, sft, write_jsonl

pytestmark = pytest.mark.slow  # torch, megatron-core models, torchrun or Ray: the slow tier

ray = pytest.importorskip("ray")

SHARDS = "3"


@pytest.fixture(scope="module")
def ray_instance():
    # (an instance of its own: without "local", Ray joins a cluster running on this host, test_ray_cluster's)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    yield
    ray.shutdown()


def same_files(a, b, suffixes):
    for suffix in suffixes:
        with open(str(a) + suffix, "rb") as x, open(str(b) + suffix, "rb") as y:
            assert x.read() == y.read(), f"{a}{suffix} and {b}{suffix} differ"


def no_leftovers(prefix):
    from qwen_data.run.ray import staging

    assert not os.path.exists(str(prefix) + ".shards"), "the shards folder was left behind"
    assert not os.path.exists(staging(str(prefix) + ".shards")), "the tasks' folder was left behind"
    assert not glob.glob(str(prefix) + "*.tmp") and not glob.glob(str(prefix) + "*.lock")


def test_pretrain_matches_local_run(tmp_path, ray_instance):
    data = corpus(tmp_path / "c.jsonl", 11, 2000, 120)
    umask = os.umask(0o002)  # (group-writable: the outputs' modes follow the umask, as a local run's do)
    try:
        local = pretrain([data], tmp_path / "local")
        remote = pretrain([data], tmp_path / "ray", "--executor", "ray", "--ray-shards", SHARDS)
    finally:
        os.umask(umask)
    same_files(local, remote, [".bin", ".idx"])
    for suffix in (".bin", ".idx", ".json"):
        assert os.stat(remote + suffix).st_mode == os.stat(local + suffix).st_mode, suffix
    # the records the shards picked, checked by the driver: the certificate of the local run
    assert manifest(remote)["certificate"] == manifest(local)["certificate"]
    assert manifest(local)["certificate"]["certified"]
    no_leftovers(remote)


def test_pretrain_several_keys_and_rejects(tmp_path, ray_instance):
    """One dataset per key, aligned, and one rejects file for the run, as a local run writes them."""
    records = [{"text": f"text {i} " * (i % 7 + 1), "title": f"title {i}"} for i in range(900)]
    for i in range(5, 900, 97):
        del records[i]["title"]
    data = write_jsonl(tmp_path / "k.jsonl", records)
    keys = ["--text-key", "text,title"]
    local = pretrain([data], tmp_path / "local", *keys)
    remote = pretrain([data], tmp_path / "ray", *keys, "--executor", "ray", "--ray-shards", SHARDS)
    for key in ("_text", "_title"):
        same_files(local + key, remote + key, [".bin", ".idx"])
    same_files(local, remote, [".rejects.jsonl"])
    no_leftovers(remote)


def test_sft_pack_matches_local_run(tmp_path, ray_instance):
    data = chats(tmp_path / "ch.jsonl", 12, 700, 50)
    extra = ["--seq-length", "256", "--pack"]
    local = sft([data], tmp_path / "local", *extra)
    remote = sft([data], tmp_path / "ray", *extra, "--executor", "ray", "--ray-shards", SHARDS)
    same_files(local, remote, [".bin", ".idx", ".lossmask.bin", ".lossmask.idx", ".rejects.jsonl"])
    assert manifest(remote)["certificate"] == manifest(local)["certificate"]
    no_leftovers(remote)


def test_rows_lacking_the_text_column_are_rejected_as_locally(tmp_path, ray_instance):
    """A parquet file without the text column beside a good one: its rows are rejects on Ray too."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    good, lacking = str(tmp_path / "good.parquet"), str(tmp_path / "lacking.parquet")
    pq.write_table(pa.table({"text": [f"text {i}" for i in range(40)]}), good, row_group_size=10)
    pq.write_table(pa.table({"body": [f"body {i}" for i in range(30)]}), lacking, row_group_size=10)
    local = pretrain([lacking, good], tmp_path / "local")
    remote = pretrain([lacking, good], tmp_path / "ray", "--executor", "ray", "--ray-shards", SHARDS)
    same_files(local, remote, [".bin", ".idx", ".rejects.jsonl"])
    m = manifest(remote)
    assert (m["documents"], m["rejects"]["count"]) == (40, 30)


def _lock_holders(path: str) -> dict[int, int]:
    """pid -> parent pid of every process with `path` open (from /proc/*/fd)."""
    holders = {}
    for fd_dir in glob.glob("/proc/[0-9]*/fd"):
        pid = int(fd_dir.split("/")[2])
        try:
            if any(os.readlink(os.path.join(fd_dir, fd)) == path for fd in os.listdir(fd_dir)):
                with open(f"/proc/{pid}/stat", "rb") as f:
                    stat = f.read()
                holders[pid] = int(stat[stat.rfind(b")") + 2:].split()[1])
        except OSError:  # gone meanwhile, or not ours to look at
            continue
    return holders


def test_killed_task_is_retried(tmp_path, ray_instance):
    from qwen_data.run.ray import run_on_ray
    from qwen_data.steps.pretrain import PretrainConfig, Tokenize

    data = corpus(tmp_path / "c.jsonl", 13, 3000, 100)
    local = pretrain([data], tmp_path / "local")
    prefix = str(tmp_path / "ray")
    held, release = str(tmp_path / "held"), str(tmp_path / "release")

    class HeldOnce(Tokenize):
        """The pretrain step, shard 1's first attempt stopping once its first chunk is made (until killed
        or released)."""

        def process(self, chunk):
            import os
            import time

            result = super().process(chunk)
            if self.config.shard.index == 1 and not os.path.exists(held):
                with open(held + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.replace(held + ".tmp", held)
                deadline = time.monotonic() + 60
                while not os.path.exists(release) and time.monotonic() < deadline:
                    time.sleep(0.05)
            return result

    killed = []

    def kill() -> None:
        deadline = time.monotonic() + 90
        while not os.path.exists(held) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not os.path.exists(held):
            return
        with open(held) as f:
            task = int(f.read())
        # The task's process (which tokenizes itself) holds its part's output lock, in its folder on this node.
        from qwen_data.run.ray import staging

        part = os.path.join(staging(prefix + ".shards"), str(task), "1")
        holders = _lock_holders(part + ".bin.lock")
        assert os.path.exists(part + ".bin.tmp")
        assert list(holders) == [task], f"the held task {task} is not the lock's one holder: {holders}"
        os.kill(task, signal.SIGKILL)
        killed.append(task)

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    config = PretrainConfig(inputs=[data], output_prefix=prefix, quiet=True, chunk_bytes=32 << 10)
    info = {}
    try:
        manifests = run_on_ray(HeldOnce(config), shards=3, info=info)
    finally:
        open(release, "w").close()
        killer.join(30)
    assert killed, "no task was killed"
    assert info["attempts"] == {0: 1, 1: 2, 2: 1}
    # each shard's task, as its result came: its time and its CPU (the line "ray: N shards done" shows them)
    assert len(info["shard_seconds"]) == len(info["shard_cpu_seconds"]) == 3
    assert all(0 < cpu for cpu in info["shard_cpu_seconds"])
    assert manifests[0].documents == 3000 and manifests[0].shard is None
    same_files(local, prefix, [".bin", ".idx"])
    no_leftovers(prefix)


def test_os_error_is_retried(tmp_path, ray_instance):
    """An OSError (a shared file system's hiccup) is transient: the task runs again."""
    from qwen_data.run.ray import run_on_ray
    from qwen_data.steps.pretrain import PretrainConfig, Tokenize

    data = corpus(tmp_path / "c.jsonl", 14, 500, 60)
    local = pretrain([data], tmp_path / "local")
    failed = str(tmp_path / "failed")

    class FailsOnce(Tokenize):
        def prepare(self):
            import errno
            import os

            shard = self.config.shard  # None: the driver's step, which checks the records picked
            if shard is not None and shard.index == 0 and not os.path.exists(failed):
                open(failed, "w").close()
                raise OSError(errno.EIO, "input/output error", data)
            super().prepare()

    config = PretrainConfig(inputs=[data], output_prefix=str(tmp_path / "ray"), quiet=True)
    info = {}
    run_on_ray(FailsOnce(config), shards=2, info=info)
    assert info["attempts"] == {0: 2, 1: 1}
    same_files(local, config.output_prefix, [".bin", ".idx"])


def _bad_inputs(tmp_path):
    """Three inputs, the middle one not a JSON array: two of about the same size around a small one,
    which so starts in the middle third of the bytes, shard 1 of 3."""
    good = [corpus(tmp_path / f"{name}.jsonl", 1, 400, 60) for name in ("a", "c")]
    broken = tmp_path / "b.json"
    broken.write_text('[{"text": "fine"}, oops')
    return [good[0], str(broken), good[1]]


def test_bad_input_fails_at_once(tmp_path, ray_instance):
    """A data error (ValueError) is not retried: the run stops with its message, leaving nothing."""
    from qwen_data.run.ray import ShardFailed, run_on_ray
    from qwen_data.steps.pretrain import PretrainConfig, Tokenize

    prefix = str(tmp_path / "out")
    config = PretrainConfig(inputs=_bad_inputs(tmp_path), output_prefix=prefix, quiet=True)
    info = {}
    with pytest.raises(ValueError, match=r"part 1/3 .*b\.json: not a JSON array") as caught:
        run_on_ray(Tokenize(config), shards=3, info=info)
    assert isinstance(caught.value, ShardFailed) and caught.value.shard.index == 1
    assert info["attempts"][1] == 1, "a data error was retried"
    assert not os.path.exists(prefix + ".bin") and not os.path.exists(prefix + ".json")
    no_leftovers(prefix)


def test_bad_input_through_the_cli(tmp_path, ray_instance, capsys):
    from qwen_data.cli import main

    prefix = str(tmp_path / "out")
    argv = ["pretrain", "--quiet", *_bad_inputs(tmp_path), "-o", prefix, "--executor", "ray", "--ray-shards", SHARDS]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error: part 1/3 of" in err and "b.json: not a JSON array" in err, err
    assert not os.path.exists(prefix + ".bin")
    no_leftovers(prefix)


def test_certified_sft_from_a_fresh_process(tmp_path):
    """As a user runs it: a new process starts Ray, the driver's checking process checks the shards'
    picked records and hands its checker back for the certificate (which once failed to unpickle)."""
    import subprocess
    import sys

    from _oracles import oracle_dir

    data = chats(tmp_path / "c.jsonl", seed=7, count=40, longest=30)
    prefix = str(tmp_path / "out")
    env = {**os.environ, "RAY_OVERRIDE_RESOURCES": '{"CPU": 2}'}
    done = subprocess.run([sys.executable, "-m", "qwen_data", "sft", "--quiet", str(data), "-o", prefix,
                           "--reference-template", str(oracle_dir() / "qwen2.5-instruct.jinja"),
                           "--executor", "ray", "--ray-shards", "2"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert manifest(prefix)["certificate"]["certified"], manifest(prefix)["certificate"]
    no_leftovers(prefix)


# -- resuming: a run's finished shards reused by the same command, checked ---------------------------
CERTIFICATE_COUNTS = ("certified", "records_checked", "records_spelled", "records_kept", "lines_checked")


def _pretrain_config(data, prefix, quiet=True):
    from qwen_data.steps.pretrain import PretrainConfig

    return PretrainConfig(inputs=[data], output_prefix=str(prefix), quiet=quiet)


def _stopped(config, monkeypatch, after=None, step_type=None):
    """A Ray run of 3 shards (of the pretrain step, or `step_type`) stopped by a KeyboardInterrupt in the
    driver: once `after` shards' results are in and saved, or (None) once every shard's are, as the merge
    begins. → the shards saved."""
    from qwen_data.run import kept
    from qwen_data.run import ray as executor
    from qwen_data.steps.pretrain import Tokenize

    saved, keep = [], kept.keep_picked

    def interrupting(shard_config, manifests, picked):
        keep(shard_config, manifests, picked)
        saved.append(shard_config.shard.index)
        if len(saved) == after:
            raise KeyboardInterrupt

    def merging(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(kept, "keep_picked", interrupting)
        if after is None:
            patched.setattr(executor, "_merge", merging)
        with pytest.raises(KeyboardInterrupt):
            executor.run_on_ray((step_type or Tokenize)(config), shards=3)
    assert os.path.exists(config.output_prefix + ".shards/run.json"), "the interrupted run's shards were removed"
    assert not os.path.exists(config.output_prefix + ".json")
    return saved


def _resumed(config, local, shards=None):
    """The run again (with `shards`: None takes the recorded count), checked to end as a run never stopped
    ends; → its info (which shards it reused, which it ran)."""
    from qwen_data.run.ray import run_on_ray
    from qwen_data.steps.pretrain import Tokenize

    info = {}
    run_on_ray(Tokenize(config), shards=shards, info=info)
    same_files(local, config.output_prefix, [".bin", ".idx"])
    ours, theirs = manifest(config.output_prefix), manifest(local)
    assert ours["fingerprint"] == theirs["fingerprint"] and ours["documents"] == theirs["documents"]
    for name in CERTIFICATE_COUNTS:  # the reused shards' records were checked again, as the others'
        assert ours["certificate"][name] == theirs["certificate"][name], name
    no_leftovers(config.output_prefix)
    assert set(info["reused"]) | set(info["attempts"]) == {0, 1, 2}
    return info


@pytest.fixture
def text(tmp_path):
    """A small corpus and a local run over it (what every Ray run must write)."""
    data = corpus(tmp_path / "c.jsonl", 21, 900, 80)
    return data, pretrain([data], tmp_path / "local")


def test_interrupted_run_reuses_its_finished_shards(tmp_path, ray_instance, text, monkeypatch, capsys):
    data, local = text
    config = _pretrain_config(data, tmp_path / "ray")
    saved = _stopped(config, monkeypatch, after=1)
    assert len(saved) == 1 and os.path.exists(f"{config.output_prefix}.shards/{saved[0]}.picked")
    # (no --ray-shards: the count recorded, not the default of 2 CPUs)
    info = _resumed(_pretrain_config(data, config.output_prefix, quiet=False), local)
    assert info["shards"] == 3 and info["reused"] == saved
    assert set(info["attempts"]) == {0, 1, 2} - set(saved), "a finished shard ran again"
    assert "ray: reusing 1 of 3 parts (checked)" in capsys.readouterr().err


@pytest.mark.parametrize("error", [OSError, ValueError])
def test_failed_shard_keeps_the_others_unless_the_data_failed(tmp_path, ray_instance, text, error):
    """Shard 1 fails once shard 0 is saved: on an OSError on every attempt (not the data's) the run keeps it and
    the next reuses it; on a ValueError (the data's) it leaves no shard behind. Shard 2, made meanwhile, never ends:
    its bytes go after shard 1's, which are never made (`ray._Placing`), so it is made again."""
    from qwen_data.run.ray import RETRIES, ShardFailed, run_on_ray
    from qwen_data.steps.pretrain import Tokenize

    data, local = text
    config = _pretrain_config(data, tmp_path / "ray")
    shards = config.output_prefix + ".shards"

    class Fails(Tokenize):
        def prepare(self):
            import os
            import time

            shard = self.config.shard  # None: the driver's step, which checks the records picked
            if shard is not None and shard.index == 1:
                deadline = time.monotonic() + 60
                while not os.path.exists(f"{shards}/0.picked") and time.monotonic() < deadline:
                    time.sleep(0.05)
                raise error(f"shard 1 fails ({error.__name__})")
            super().prepare()

    info = {}
    with pytest.raises(ShardFailed, match="part 1/3") as caught:
        run_on_ray(Fails(config), shards=3, info=info)
    assert isinstance(caught.value.cause, error)
    if error is ValueError:
        assert info["attempts"][1] == 1
        no_leftovers(config.output_prefix)
        return
    assert info["attempts"][1] == RETRIES + 1
    assert sorted(name for name in os.listdir(shards) if name.endswith(".picked")) == ["0.picked"]
    info = _resumed(config, local)
    assert info["reused"] == [0] and info["attempts"] == {1: 1, 2: 1}


def test_a_damaged_shard_is_done_again(tmp_path, ray_instance, text, monkeypatch, capsys):
    data, local = text
    config = _pretrain_config(data, tmp_path / "ray")
    assert _stopped(config, monkeypatch) != []
    # Every shard was joined before the stop: each .bin went once copied into the merge's head, and the
    # rerun puts them back from there (`merge.restore`), checked as any shard is.
    shards = config.output_prefix + ".shards"
    assert sorted(name for name in os.listdir(shards) if name.endswith(".bin")) == []
    head = f"{shards}/joined/0.0.bin"
    from qwen_data.run.merge import held

    parts = held(head)
    assert [os.path.relpath(name, os.path.dirname(head)) for name, _ in parts] == ["../0", "../1", "../2"]
    at = parts[0][1] + 8  # one byte of an id of shard 1, the size kept
    with open(head, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 1]))
    info = _resumed(_pretrain_config(data, config.output_prefix, quiet=False), local)
    assert info["reused"] == [0, 2] and info["attempts"] == {1: 1}
    err = capsys.readouterr().err
    assert "ray: part 1 redone: " in err and "fingerprint" in err, err


def test_picked_records_that_do_not_check_out_redo_their_shard(tmp_path, ray_instance, text, monkeypatch, capsys):
    """Shard 0's saved picked records altered (an id that its files do not hold), shard 2's missing:
    both done again; shard 1 reused, its records checked again (the certificate's counts)."""
    import pickle

    data, local = text
    config = _pretrain_config(data, tmp_path / "ray")
    _stopped(config, monkeypatch)
    shards = config.output_prefix + ".shards"
    with open(f"{shards}/0.picked", "rb") as f:
        saved = pickle.load(f)
    assert saved["picked"], "shard 0 picked no record: nothing to alter"
    where, (number, position, parts), documents = saved["picked"][0]
    ids = parts[0][1].copy()
    ids[0] += 1
    saved["picked"][0] = (where, (number, position, [(parts[0][0], ids, *parts[0][2:])] + parts[1:]), documents)
    with open(f"{shards}/0.picked", "wb") as f:
        pickle.dump(saved, f)
    os.remove(f"{shards}/2.picked")
    info = _resumed(_pretrain_config(data, config.output_prefix, quiet=False), local)
    assert info["reused"] == [1] and info["attempts"] == {0: 1, 2: 1}
    err = capsys.readouterr().err
    assert "ray: part 0 redone: its picked records do not read back from its files" in err, err
    assert "ray: part 2 redone: " in err and "not saved" in err, err


@pytest.mark.parametrize("change", ["input", "shards"])
def test_another_command_reuses_nothing(tmp_path, ray_instance, text, monkeypatch, change):
    data, local = text
    config = _pretrain_config(data, tmp_path / "ray")
    _stopped(config, monkeypatch)
    shards = 3
    if change == "input":  # one more record: other pins, so another run
        with open(data, "a", encoding="utf-8") as f:
            f.write('{"text": "one more record"}\n')
        local = pretrain([data], tmp_path / "local2")
    else:
        shards = 2
    info = {}
    from qwen_data.run.ray import run_on_ray
    from qwen_data.steps.pretrain import Tokenize

    run_on_ray(Tokenize(config), shards=shards, info=info)
    assert info["reused"] == [] and set(info["attempts"]) == set(range(shards))
    same_files(local, config.output_prefix, [".bin", ".idx"])
    no_leftovers(config.output_prefix)


def test_sft_resume_reads_back_the_saved_samples(tmp_path, ray_instance, monkeypatch, capsys):
    """Packed SFT (the shards leave their samples for the merge to pack): a saved sample whose loss mask
    differs from its shard's files redoes that shard; the others are reused, their samples checked again."""
    import pickle

    from _oracles import oracle_dir
    from qwen_data.run.ray import run_on_ray
    from qwen_data.steps.sft import ChatSamples, SFTConfig

    data = chats(tmp_path / "ch.jsonl", 12, 400, 50)
    extra = ["--seq-length", "256", "--pack", "--reference-template", oracle_dir() / "qwen2.5-instruct.jinja"]
    local = sft([data], tmp_path / "local", *extra)
    config = SFTConfig(inputs=[data], output_prefix=str(tmp_path / "ray"), seq_length=256, pack=True,
                       reference_template=str(oracle_dir() / "qwen2.5-instruct.jinja"))
    _stopped(config, monkeypatch, step_type=ChatSamples)
    path = config.output_prefix + ".shards/1.picked"
    with open(path, "rb") as f:
        saved = pickle.load(f)
    # a picked sample (its ids and mask as made; where it lies and the length kept, apart: `_Batching.fit`)
    where, (number, (source, count, [(k, ids, mask), *others]), written), documents = saved["picked"][0]
    mask = mask.copy()
    mask[-1] ^= 1
    saved["picked"][0] = (where, (number, (source, count, [(k, ids, mask), *others]), written), documents)
    with open(path, "wb") as f:
        pickle.dump(saved, f)
    info = {}
    run_on_ray(ChatSamples(config), info=info)
    assert info["reused"] == [0, 2] and info["attempts"] == {1: 1}
    assert "ray: part 1 redone: its picked records do not read back" in capsys.readouterr().err
    same_files(local, config.output_prefix, [".bin", ".idx", ".lossmask.bin", ".lossmask.idx", ".rejects.jsonl"])
    ours, theirs = manifest(config.output_prefix)["certificate"], manifest(local)["certificate"]
    assert ours["certified"] and ours["samples_checked"] == theirs["samples_checked"]
    assert ours["records_checked"] == theirs["records_checked"] and ours["lines_checked"] == theirs["lines_checked"]
    no_leftovers(config.output_prefix)


class _Recorded:
    """A pretrain step that notes, as each part starts, its index and the process running it (in `log`)."""

    @staticmethod
    def step(log):
        from qwen_data.steps.pretrain import Tokenize

        class Recorded(Tokenize):
            def prepare(self):
                import os

                if self.config.shard is not None:  # (None: the driver's step)
                    with open(log, "a") as f:
                        f.write(f"{self.config.shard.index} {os.getpid()}\n")
                super().prepare()

        return Recorded


def _small_parts(monkeypatch, data, prefix):
    """Parts of about a tenth of `data`'s bytes for 2 shards (chunks small enough to cut so many)."""
    from qwen_data.run import ray as executor
    from qwen_data.steps.pretrain import PretrainConfig

    monkeypatch.setattr(executor, "PART_BYTES", os.path.getsize(data) // 10 + 1)
    return PretrainConfig(inputs=[data], output_prefix=str(prefix), quiet=True, chunk_bytes=8 << 10)


def test_shards_take_parts_in_turn(tmp_path, ray_instance, text, monkeypatch):
    """Two shards of 10 parts: each task takes the next part not taken until none is left, in its own process,
    every part once, and the output is the local run's."""
    from qwen_data.run.ray import run_on_ray

    data, local = text
    config = _small_parts(monkeypatch, data, tmp_path / "ray")
    log, info = tmp_path / "parts.log", {}
    run_on_ray(_Recorded.step(log)(config), shards=2, info=info)
    assert (info["shards"], info["parts"]) == (2, 10) and info["attempts"] == {k: 1 for k in range(10)}
    by_process = {}
    for line in log.read_text().splitlines():
        index, pid = map(int, line.split())
        by_process.setdefault(pid, []).append(index)
    assert len(by_process) == 2 and sorted(sum(by_process.values(), [])) == list(range(10)), by_process
    assert all(parts == sorted(parts) for parts in by_process.values()), by_process
    same_files(local, config.output_prefix, [".bin", ".idx"])
    ours, theirs = manifest(config.output_prefix), manifest(local)
    assert ours["fingerprint"] == theirs["fingerprint"]
    # the lines checked, numbered from each part's count of the newlines before it: the local run's
    assert ours["certificate"]["lines_checked"] == theirs["certificate"]["lines_checked"] != {}
    no_leftovers(config.output_prefix)


def test_a_retried_shard_runs_only_its_parts_not_ended(tmp_path, ray_instance, text, monkeypatch):
    """The task running part 3 fails with an OSError the first time: Ray runs the task again, part 3 goes back
    to be taken first, and no part ended before (placed, told to the tally) is run again: only one its task had
    made before part 3 and not yet placed (its bytes waited for a part of the other task's) goes back with it."""
    from qwen_data.run.ray import run_on_ray

    data, local = text
    config = _small_parts(monkeypatch, data, tmp_path / "ray")
    failed = str(tmp_path / "failed")
    log = tmp_path / "parts.log"

    class FailsOnce(_Recorded.step(log)):
        def prepare(self):
            import errno
            import os

            if self.config.shard is not None and self.config.shard.index == 3 and not os.path.exists(failed):
                open(failed, "w").close()
                raise OSError(errno.EIO, "input/output error", data)
            super().prepare()

    info = {}
    run_on_ray(FailsOnce(config), shards=2, info=info)
    again = {part for part, attempts in info["attempts"].items() if attempts > 1}
    assert set(info["attempts"]) == set(range(10)) and max(info["attempts"].values()) == 2
    assert 3 in again and again <= {1, 2, 3}, f"parts {again} ran again"
    started = [int(line.split()[0]) for line in log.read_text().splitlines()]
    # (part 3's first attempt failed before it was noted)
    assert sorted(set(started)) == list(range(10)) and len(started) == 10 + len(again - {3})
    same_files(local, config.output_prefix, [".bin", ".idx"])


def test_a_stopped_run_of_parts_reuses_those_ended(tmp_path, ray_instance, text, monkeypatch, capsys):
    """Stopped once 4 of 10 parts are saved, the same command reuses those 4 (its shard count and part count
    recorded; their bytes put back from the heads as their marks say) and runs the other 6 in turn."""
    from qwen_data.run import kept
    from qwen_data.run.ray import run_on_ray
    from qwen_data.steps.pretrain import Tokenize

    data, local = text
    config = _small_parts(monkeypatch, data, tmp_path / "ray")
    saved, keep = [], kept.keep_picked

    def interrupting(part_config, manifests, picked):
        keep(part_config, manifests, picked)
        saved.append(part_config.shard.index)
        if len(saved) == 4:
            raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(kept, "keep_picked", interrupting)
        with pytest.raises(KeyboardInterrupt):
            run_on_ray(Tokenize(config), shards=2)
    # Each part's bytes lie in the heads, where its task wrote them: what says where is its own mark (K.placed),
    # written by the task (the heads' records, written by the driver in order, are gone here)
    shards = config.output_prefix + ".shards"
    assert not glob.glob(f"{shards}/*.bin") and set(saved) <= {
        int(os.path.basename(path).split(".")[0]) for path in glob.glob(f"{shards}/*.placed")}
    for record in glob.glob(f"{shards}/joined/*.parts"):
        os.remove(record)
    info = {}
    run_on_ray(Tokenize(dataclasses.replace(config, quiet=False)), info=info)
    assert (info["shards"], info["parts"]) == (2, 10) and sorted(info["reused"]) == sorted(saved)
    assert set(info["attempts"]) == set(range(10)) - set(saved), "a part saved ran again"
    assert "ray: reusing 4 of 10 parts (checked)" in capsys.readouterr().err
    same_files(local, config.output_prefix, [".bin", ".idx"])
    assert manifest(config.output_prefix)["certificate"]["certified"]
    no_leftovers(config.output_prefix)
