"""Scoped stand-ins for what megatron-core assumes of a run: CUDA, and a process group.

Each is a context manager that restores what it replaced on exit, so nothing outside the
`with` block (another test, a later GPU run in the same process) sees a patched library.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch


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


class _TorchOnCpu:
    """`torch` as megatron-core's pipeline schedules see it inside `megatron_on_cpu`: what they
    make on "cuda" is made on the CPU."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def zeros(*args, device=None, **kwargs) -> torch.Tensor:
        return torch.zeros(*args, device="cpu" if device == "cuda" else device, **kwargs)


@contextlib.contextmanager
def megatron_on_cpu() -> Iterator[None]:
    """Let megatron-core's local spec build, run and checkpoint on a machine without CUDA
    (smoke tests, CI); does nothing where CUDA is available.

    megatron-core asks `torch.cuda.current_device()` for the device of RoPE's inverse frequencies,
    of its global memory buffer and of pipeline messages, forks the CUDA RNG tracker around
    dropout, and dist_checkpointing synchronises CUDA before writing: inside the block these point
    at the CPU or do nothing.
    """
    if torch.cuda.is_available():
        yield
        return
    from megatron.core import tensor_parallel
    from megatron.core.pipeline_parallel import schedules

    with contextlib.ExitStack() as stack:
        stack.enter_context(_replaced(torch.cuda, "current_device", lambda: "cpu"))
        stack.enter_context(_replaced(torch.cuda, "synchronize", lambda device=None: None))
        # Tied embeddings over pipeline stages: the stages agree on the weight with `.cuda()` then
        # an all-reduce; the schedules count tokens in a tensor made on "cuda".
        stack.enter_context(_replaced(torch.Tensor, "cuda", lambda self, *args, **kwargs: self))
        stack.enter_context(_replaced(schedules, "torch", _TorchOnCpu()))
        stack.enter_context(_replaced(tensor_parallel.get_cuda_rng_tracker(), "fork",
                                      lambda *args, **kwargs: contextlib.nullcontext()))
        yield


@contextlib.contextmanager
def single_process_rank() -> Iterator[None]:
    """megatron-core ≤0.17 calls torch.distributed.get_rank() unguarded when it writes a
    BlendedDataset cache; a process outside any process group is rank 0."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        yield
        return
    with _replaced(dist, "get_rank", lambda group=None: 0):
        yield
