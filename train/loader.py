"""The run's datasets and the order each rank reads them in."""

from __future__ import annotations

import os
from typing import Iterator

import torch
from megatron.core import parallel_state
from torch.utils.data import DataLoader

from qwen_data.blend.read import read_train_blend

from .config import DataConfig, TrainConfig
from .data import build_datasets, check_data
from .plan import RunPlan


class StepBatches(torch.utils.data.Sampler):
    """Megatron's sample order: global batch after global batch from `consumed` on; each
    data-parallel rank takes its `micro_batch_size` slice of every run of mbs × dp samples. A step's
    slices come as one list, so the loader's workers hand over a step in one piece."""

    def __init__(self, total: int, consumed: int, micro_batch_size: int, accumulation: int, dp_rank: int,
                 dp_size: int) -> None:
        self.total, self.consumed = total, consumed
        self.mbs, self.accumulation, self.dp_rank, self.dp_size = micro_batch_size, accumulation, dp_rank, dp_size

    def __iter__(self) -> Iterator[list[int]]:
        stride = self.mbs * self.dp_size
        step = stride * self.accumulation
        for start in range(self.consumed, self.total - step + 1, step):
            firsts = range(start + self.dp_rank * self.mbs, start + step, stride)
            yield [i for first in firsts for i in range(first, first + self.mbs)]

    def __len__(self) -> int:
        return max(0, (self.total - self.consumed) // (self.mbs * self.dp_size * self.accumulation))


def make_loader(dataset, consumed: int, plan: RunPlan, num_workers: int, device: torch.device) -> Iterator[dict]:
    """This rank's micro-batches from sample `consumed` on (CPU tensors, pinned for a GPU), as many a
    step as the plan's accumulation, over its data-parallel ranks.

    Workers collate a whole step at a time: handing over each micro-batch on its own took ~3 ms of
    the training process's time a micro-batch (~1% of a 7B step of 32 micro-batches over two
    pipeline stages, whose GPUs wait for it)."""
    micro_batch_size, accumulation = plan.micro_batch_size, plan.accumulation
    sampler = StepBatches(len(dataset), consumed, micro_batch_size, accumulation,
                          parallel_state.get_data_parallel_rank(), plan.dp)
    pin = device.type == "cuda"
    if pin:
        same_threads_as_pinning()
    steps = DataLoader(dataset, batch_sampler=sampler, num_workers=num_workers, pin_memory=pin,
                       persistent_workers=num_workers > 0, prefetch_factor=2 if num_workers else None)
    for step in steps:
        for first in range(0, accumulation * micro_batch_size, micro_batch_size):
            yield {k: v[first:first + micro_batch_size] for k, v in step.items()}


def same_threads_as_pinning() -> None:
    """This thread's intra-op thread count set to 1, what torch's pin-memory thread sets.

    torch.set_num_threads sets the calling thread's count and the count every thread started later
    begins with: once the pin-memory thread has run, autograd's GPU threads start with 1 while this
    thread keeps its own. Compiled code guards on the count, so code compiled here (the first
    forward) and run again there (activation recompute in backward) recompiled. The count only
    sizes this thread's CPU operations, which on a GPU run are small."""
    torch.set_num_threads(1)


def build_splits(config: TrainConfig, global_batch: int):
    """(train, valid) datasets sized for every step and every evaluation of the run."""
    data, evals = config.data, config.eval
    evaluations = config.train_iters // evals.eval_interval + 1 if evals.eval_interval else 0
    train, valid, _ = build_datasets(
        data.path, config.seq_length,
        train_samples=config.train_iters * global_batch,
        valid_samples=evaluations * evals.eval_iters * global_batch,  # none without evaluation
        test_samples=0,
        seed=config.seed, cache_dir=data.data_cache, split=data.split,
        reset_position_ids=data.reset_position_ids, reset_attention_mask=data.reset_attention_mask,
        eod_mask_loss=data.eod_mask_loss, allow_uncertified=data.allow_uncertified,
    )
    return train, valid


def check_inputs(data: DataConfig) -> None:
    """The data's bytes against their manifests (`data.check_data`), before a process group or a model
    exists. Once per node: by its local rank 0 (torchrun's LOCAL_RANK), as a node's ranks read the same
    files; the other ranks wait for every node's at megatron-core's barrier after rank 0 builds the
    datasets, before any of them builds a model. Rank 0 states the cost; a refusal ends the job."""
    if not data.data_check or int(os.environ.get("LOCAL_RANK", 0)) != 0:
        return
    line = check_data(read_train_blend(data.path, data.split).sources)
    if int(os.environ.get("RANK", 0)) == 0:
        print(line, flush=True)
