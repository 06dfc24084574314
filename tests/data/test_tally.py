"""How a Ray run's tasks take their parts (`run.tally.Tally`, `run.ray._first_part`), without Ray: each task's first
attempt runs one of the first parts without asking the tally; a retry asks, and gets back the part the attempt
before it held."""

from __future__ import annotations

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
    assert tally.next(1, 1, _ended(1)) == (3, 1)  # task 1 ended part 1, takes the first part not handed
    assert tally.next(0, 1, _ended(0)) == (4, 1)
    assert [f[0] for f in tally.totals()[3]] == [1, 0]
    assert tally.next(7, 1) is None  # (a task the tally never began)


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
    assert tally.next(1, 1, _ended(1)) is None and tally.totals()[3] == []  # (the attempt superseded: not taken)
    assert tally.next(1, 2, _ended(1)) == (2, 1) and tally.next(0, 1, _ended(0)) == (3, 1)
    assert [f[0] for f in tally.totals()[3]] == [1, 0]
