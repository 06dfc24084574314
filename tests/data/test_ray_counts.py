"""How a Ray run counts the newlines before each part (`run.ray._newline_counts`), without Ray: a stand-in runs
each counting task at once. The tasks are few (a piece each for the first round of parts, then about a shard's
share of the pieces each), and each part's count is the file's own."""

from __future__ import annotations

import os

from qwen_data.inputs.files import Shard, expand
from qwen_data.inputs.jsonl import newlines_in
from qwen_data.inputs.readers import counted_until
from qwen_data.run import ray as executor


class _Now:
    """Ray as `_newline_counts` calls it: a remote function runs when called; its reference is its value."""

    def __init__(self) -> None:
        self.calls = 0

    def remote(self, function):
        now = self

        class Remote:
            def options(self, **_):
                return self

            def remote(self, *args):
                now.calls += 1
                return function(*args)

        return Remote()


def test_newlines_before_each_part_are_counted_in_few_tasks(tmp_path):
    data = tmp_path / "c.jsonl"
    data.write_text("".join(f'{{"text": "{"x" * (k % 37)}"}}\n' for k in range(3000)))
    sources = expand([str(data)])
    parts, tasks = 40, 4
    configs = [type("Config", (), {"shard": Shard(k, parts)}) for k in range(parts)]
    ray = _Now()
    pieces, before = executor._newline_counts(ray, sources, configs, tasks)
    assert ray.calls == tasks + tasks  # a piece each for the first 4 parts' starts, then 4 tasks for the other 35
    (path, counted), = pieces.items()
    counts = [n for found, _ in counted for n in found]
    assert [n for _, n in counted] == [1, 1, 1, 1, 9, 9, 9, 8] and len(counts) == parts - 1
    for config in configs[1:]:  # (part 0 starts at the file's start: nothing before it)
        where, n = before[config.shard.index]
        assert where == path and sum(counts[:n]) == newlines_in(os.fspath(data), 0, counted_until(sources,
                                                                                                  config.shard)[1])
    assert 0 not in before
