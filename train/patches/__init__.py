"""What megatron-core needs around it in this process, entered once: `with megatron_core():`.

The patches live by how long they are needed, one module each:
  cpu       stand-ins for CUDA where there is none (smoke tests, CI); nothing on a GPU host
  compat    backports from newer megatron-core, each applied only below the version that fixes it
  autocast  what float32 masters under autocast cost: every run of the trainer needs them

Each replaces an attribute with `_replaced`, which restores it on exit, so nothing outside the
`with` block (another test, a later run in the same process) sees a patched library.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


@contextlib.contextmanager
def _replaced(owner: Any, name: str, value: Any) -> Iterator[None]:
    """`owner.name` is `value` inside the block; afterwards exactly what it was (an attribute the
    owner only inherited is removed again, not frozen into an own copy)."""
    own = vars(owner)
    had_own, original = name in own, own.get(name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if had_own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)


@contextlib.contextmanager
def megatron_core() -> Iterator[None]:
    """megatron-core as this process runs it: on the CPU where there is no CUDA, with the backports
    its version lacks, and fit for float32 weights under autocast. Entering it again inside the
    block is harmless: each inner replacement restores the outer one."""
    from . import autocast, compat, cpu

    with cpu.megatron_on_cpu(), compat.backports(), autocast.float32_masters_under_autocast():
        yield
