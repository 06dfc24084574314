"""`--executor ray`: shards as Ray tasks, merged into exactly the bytes of one local run.

One local Ray instance (2 CPUs) serves the whole module; the runs join it (`run_on_ray` uses the
instance this process already has). A killed task is made deterministic without any hook in
qwen-data: the run is given a `run` (a test function) whose progress object holds shard 1's first
attempt after its first chunk, the task then found through /proc as the process holding the
shard's output lock, and killed.
"""

from __future__ import annotations

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
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    yield
    ray.shutdown()


def same_files(a, b, suffixes):
    for suffix in suffixes:
        with open(str(a) + suffix, "rb") as x, open(str(b) + suffix, "rb") as y:
            assert x.read() == y.read(), f"{a}{suffix} and {b}{suffix} differ"


def no_leftovers(prefix):
    assert not os.path.exists(str(prefix) + ".shards"), "the shards folder was left behind"
    assert not glob.glob(str(prefix) + "*.tmp") and not glob.glob(str(prefix) + "*.lock")


def test_pretrain_matches_local_run(tmp_path, ray_instance):
    data = corpus(tmp_path / "c.jsonl", 11, 2000, 120)
    local = pretrain([data], tmp_path / "local")
    remote = pretrain([data], tmp_path / "ray", "--executor", "ray", "--ray-shards", SHARDS)
    same_files(local, remote, [".bin", ".idx"])
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
        # The task's process (which tokenizes itself) holds its shard's output lock.
        holders = _lock_holders(os.path.join(prefix + ".shards", "1.bin.lock"))
        assert os.path.exists(os.path.join(prefix + ".shards", "1.bin.tmp"))
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
    with pytest.raises(ValueError, match=r"shard 1/3 .*b\.json: not a JSON array") as caught:
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
    assert "error: shard 1/3 of" in err and "b.json: not a JSON array" in err, err
    assert not os.path.exists(prefix + ".bin")
    no_leftovers(prefix)
