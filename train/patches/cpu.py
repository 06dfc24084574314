"""Stand-ins for CUDA on a machine without it (smoke tests, CI): megatron-core's local spec builds,
runs and checkpoints on the CPU. Nothing here is entered where CUDA is available."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from .replacing import replaced as _replaced


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
    """megatron-core asks `torch.cuda.current_device()` for the device of RoPE's inverse frequencies,
    of its global memory buffer and of pipeline messages, forks the CUDA RNG tracker around
    dropout and keeps the CUDA generator's state for activation recompute, and dist_checkpointing
    synchronises CUDA before writing: inside the block these point at the CPU or do nothing.
    Does nothing where CUDA is available.
    """
    if torch.cuda.is_available():
        yield
        return
    from megatron.core import tensor_parallel
    from megatron.core.models.common.embeddings import rotary_pos_embedding
    from megatron.core.pipeline_parallel import schedules

    with contextlib.ExitStack() as stack:
        # Under context parallelism RoPE keeps this rank's positions, picked by an index tensor
        # made in pinned memory, which needs CUDA.
        stack.enter_context(_replaced(rotary_pos_embedding, "get_pos_emb_on_this_cp_rank", _pos_emb_on_this_cp_rank))
        stack.enter_context(_replaced(torch.cuda, "current_device", lambda: "cpu"))
        stack.enter_context(_replaced(torch.cuda, "synchronize", lambda device=None: None))
        # Tied embeddings over pipeline stages: the stages agree on the weight with `.cuda()` then
        # an all-reduce; the schedules count tokens in a tensor made on "cuda".
        stack.enter_context(_replaced(torch.Tensor, "cuda", lambda self, *args, **kwargs: self))
        stack.enter_context(_replaced(schedules, "torch", _TorchOnCpu()))
        stack.enter_context(_replaced(tensor_parallel.get_cuda_rng_tracker(), "fork",
                                      lambda *args, **kwargs: contextlib.nullcontext()))
        # Activation recompute saves and restores the CUDA generator's state around the forward.
        stack.enter_context(_replaced(tensor_parallel.random, "_get_cuda_rng_state", lambda *args, **kwargs: None))
        stack.enter_context(_replaced(tensor_parallel.random, "_set_cuda_rng_state", lambda *args, **kwargs: None))
        yield


def _pos_emb_on_this_cp_rank(pos_emb: torch.Tensor, seq_dim: int, cp_group) -> torch.Tensor:
    from ..attention import context_positions

    return pos_emb.index_select(seq_dim, context_positions(pos_emb.shape[seq_dim], cp_group.rank(), cp_group.size()))
