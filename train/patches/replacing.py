"""The one way a patch replaces an attribute: for a block, restored exactly on exit."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


@contextlib.contextmanager
def replaced(owner: Any, name: str, value: Any) -> Iterator[None]:
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
