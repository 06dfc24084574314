"""Process groups: torch.distributed (nccl on GPUs, gloo on the CPU) and megatron-core's
tensor/pipeline/data-parallel groups, and how a global batch spreads over them."""

from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.distributed as dist
from megatron.core import parallel_state


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(tp: int, pp: int = 1) -> torch.device:
    """Join torchrun's process group (or make one of a lone process), set up megatron-core's
    groups; → this rank's device."""
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        if "MASTER_ADDR" in os.environ:
            dist.init_process_group("nccl" if cuda else "gloo")
        else:
            dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}",
                                    rank=0, world_size=1)
    world = dist.get_world_size()
    if world % (tp * pp):
        raise ValueError(f"world size {world} is not a multiple of --tp {tp} × --pp {pp}")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    return device


@contextlib.contextmanager
def distributed(tp: int, pp: int = 1) -> Iterator[torch.device]:
    """`init_distributed` for the block; the groups are torn down after it, also on error."""
    try:
        yield init_distributed(tp, pp)
    finally:
        if dist.is_initialized():
            parallel_state.destroy_model_parallel()
            dist.destroy_process_group()


def is_rank0() -> bool:
    return dist.get_rank() == 0


def log0(*args) -> None:
    if is_rank0():
        print(*args, flush=True)


@dataclass(frozen=True)
class Layout:
    """The parallel layout of a step: TP × PP × DP ranks; each pipeline runs `accumulation`
    micro-batches."""

    tp: int
    pp: int
    dp: int
    world: int
    micro_batch: int
    global_batch: int

    @property
    def accumulation(self) -> int:
        return self.global_batch // (self.micro_batch * self.dp)

    @classmethod
    def current(cls, micro_batch: int, global_batch: Optional[int]) -> Layout:
        """Of the groups `init_distributed` made; `global_batch` None = one micro-batch per DP rank."""
        dp = parallel_state.get_data_parallel_world_size()
        global_batch = global_batch or micro_batch * dp
        if global_batch % (micro_batch * dp):
            raise ValueError(f"global batch {global_batch} is not a multiple of micro batch × DP "
                             f"({micro_batch} × {dp})")
        return cls(parallel_state.get_tensor_model_parallel_world_size(),
                   parallel_state.get_pipeline_model_parallel_world_size(), dp, dist.get_world_size(),
                   micro_batch, global_batch)
