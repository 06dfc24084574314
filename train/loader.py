"""The run's datasets and the order each rank reads them in."""

from __future__ import annotations

from typing import Iterator

import torch
from megatron.core import parallel_state
from torch.utils.data import DataLoader

from .config import TrainConfig
from .data import build_datasets


class MicroBatches(torch.utils.data.Sampler):
    """Megatron's sample order: global batch after global batch from `consumed` on; each
    data-parallel rank takes its `micro_batch_size` slice of every run of mbs × dp samples."""

    def __init__(self, total: int, consumed: int, micro_batch_size: int, dp_rank: int, dp_size: int) -> None:
        self.total, self.consumed = total, consumed
        self.mbs, self.dp_rank, self.dp_size = micro_batch_size, dp_rank, dp_size

    def __iter__(self) -> Iterator[list[int]]:
        stride = self.mbs * self.dp_size
        for start in range(self.consumed, self.total - stride + 1, stride):
            first = start + self.dp_rank * self.mbs
            yield list(range(first, first + self.mbs))

    def __len__(self) -> int:
        return max(0, (self.total - self.consumed) // (self.mbs * self.dp_size))


def make_loader(dataset, consumed: int, micro_batch_size: int, num_workers: int,
                device: torch.device) -> Iterator[dict]:
    """This rank's micro-batches from sample `consumed` on (CPU tensors, pinned for a GPU)."""
    sampler = MicroBatches(len(dataset), consumed, micro_batch_size,
                           parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size())
    return iter(DataLoader(dataset, batch_sampler=sampler, num_workers=num_workers,
                           pin_memory=device.type == "cuda", persistent_workers=num_workers > 0,
                           prefetch_factor=4 if num_workers else None))


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
        eod_mask_loss=data.eod_mask_loss,
    )
    return train, valid
