"""How a Ray run's tasks take their parts (`run.tally.Tally`, `run.ray._first_part`), without Ray: each task's first
attempt runs one of the first parts without asking the tally; a retry asks, and gets back the part the attempt
before it held. Where each part's bytes go (the tally's offsets) and where a node's tasks make them (`ray.staging`)."""

from __future__ import annotations

import os

from qwen_data.run import ray as executor
from qwen_data.run.tally import Tally


class _Calls:
    """Ray as `_first_part` calls it: an actor's method runs when called; its reference is its value. Counts the
    calls."""

    def __init__(self, tally: Tally) -> None:
        self.calls: list[str] = []
        self.tally = self

        def method(name):
            class Method:
                def remote(_, *args):
                    self.calls.append(name)
                    return getattr(tally, name)(*args)
            return Method()

        self.start, self.next = method("start"), method("next")

    def get(self, value, timeout=None):
        return value


def _ended(part: int) -> tuple:
    return part, [], [], (0.0, 0.0, 0.0, None)


def test_first_parts_are_held_from_the_start_and_the_rest_handed_in_order():
    tally = Tally(list(range(6)), first=[0, 1, 2])
    assert tally.held_by(1) == 1 and tally.attempts == {0: 1, 1: 1, 2: 1}
    assert tally.next(1, 1, _ended(1), [10])[0] == (3, 1)  # task 1 made part 1, takes the first part not handed
    assert tally.next(0, 1, _ended(0), [20])[0] == (4, 1)
    tally.tell_placed(1, 1, [1])
    tally.tell_placed(0, 1, [0])
    assert [f[0] for f in tally.totals()[3]] == [1, 0]
    assert tally.next(7, 1) == (None, {})  # (a task the tally never began)


def test_a_part_is_placed_after_every_part_before_it_and_ends_once_placed():
    """Where each part's bytes go in each file (here two: ids, loss mask) is known once every part before it told
    its sizes, whatever the order they were made in; the driver takes a part's end only once it is placed."""
    tally = Tally([0, 1, 2], first=[0, 1, 2], sizes={3: [7, 1]})  # (part 3: an earlier run's, reused: not run)
    assert tally.next(2, 1, _ended(2), [30, 3]) == (None, {})  # part 2 made first: parts 0 and 1 are not
    assert tally.next(0, 1, _ended(0), [10, 1]) == (None, {0: [0, 0]})
    tally.tell_placed(0, 1, [0])
    assert [f[0] for f in tally.totals()[3]] == [0]
    assert tally.offsets(2) == {}
    assert tally.next(1, 1, _ended(1), [20, 2]) == (None, {1: [10, 1]})
    assert tally.offsets(2) == {2: [30, 3]} and tally.offsets(2, attempt=2) == {}
    assert tally.totals()[3] == []  # (made, not placed)
    tally.tell_placed(2, 1, [2])
    tally.tell_placed(1, 1, [1])
    assert [f[0] for f in tally.totals()[3]] == [2, 1]
    assert tally.starts[3] == [60, 6]


def test_a_dead_attempts_parts_not_placed_go_back_and_must_come_out_the_same_size():
    tally = Tally(list(range(4)), first=[0, 1])
    assert tally.next(1, 1, _ended(1), [10]) == ((2, 1), {})  # part 1 made, waiting for part 0's sizes
    assert tally.start(1) == 2  # its process died: parts 2 (held) and 1 (made, not placed) go back, in order
    assert tally.next(1, 2)[0] == (1, 2) and tally.next(1, 2, _ended(1), [10])[0] == (2, 2)
    assert tally.next(0, 1, _ended(0), [5]) == ((3, 1), {0: [0]})
    try:
        tally.start(0)  # (a retry of task 0, making part 0 again: its size differs)
        tally.next(0, 2)
        tally.next(0, 2, _ended(0), [6])
    except RuntimeError as exc:
        assert "part 0 was made again with other sizes" in str(exc)
    else:
        raise AssertionError("a part made again with other sizes was taken")


def test_a_retry_asks_and_gets_back_the_part_the_attempt_before_held(tmp_path):
    tally = Tally(list(range(4)), first=[0, 1])
    ray = _Calls(tally)
    marks = str(tmp_path)
    assert executor._first_part(ray, ray, 1, 1, marks) == (1, (1, 1))
    assert ray.calls == []  # the first attempt asked nothing
    tally.report(1, 1, (5, 5, 5, 5))
    # its process died holding part 1: the retry finds its mark, and part 1 comes back first, a second attempt
    assert executor._first_part(ray, ray, 1, 1, marks) == (2, (1, 2))
    assert ray.calls == ["start", "next"]
    tally.report(1, 1, (9, 9, 9, 9))  # the dead attempt's late report: ignored
    assert tally.totals()[0] == (0, 0, 0, 0)
    assert tally.next(1, 1, _ended(1), [4]) == (None, {})  # (the attempt superseded: not taken)
    assert tally.totals()[3] == []
    assert tally.next(1, 2, _ended(1), [4])[0] == (2, 1) and tally.next(0, 1, _ended(0), [3])[0] == (3, 1)
    tally.tell_placed(0, 1, [0])
    tally.tell_placed(1, 2, [1])
    assert [f[0] for f in tally.totals()[3]] == [0, 1]


def test_a_nodes_parts_are_made_in_memory_where_it_has_room_and_a_dead_tasks_folder_goes(tmp_path, monkeypatch):
    """`ray.staging`: /dev/shm where it has STAGING_ROOM free, else the temp folder, one folder a run (by its
    PREFIX.shards/); `_clear_dead`: the folders of tasks whose process is gone removed, a live one's kept."""
    import subprocess
    import tempfile

    shards = str(tmp_path / "out.shards")
    monkeypatch.setattr(executor, "MEMORY", str(tmp_path))  # (a tmpfs or not: its free space is what counts)
    monkeypatch.setattr(executor, "STAGING_ROOM", 1)
    root = executor.staging(shards)
    assert os.path.dirname(root) == str(tmp_path) and root == executor.staging(shards + "/")
    assert root != executor.staging(str(tmp_path / "other.shards"))
    monkeypatch.setattr(executor, "STAGING_ROOM", 1 << 62)
    assert os.path.dirname(executor.staging(shards)) == tempfile.gettempdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    for pid in (dead.pid, os.getpid()):
        os.makedirs(os.path.join(root, str(pid)))
    executor._clear_dead(root)
    assert os.listdir(root) == [str(os.getpid())]
