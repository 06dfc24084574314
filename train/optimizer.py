"""AdamW, its warmup + cosine learning rate, and the global gradient-norm clipping before each step."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.tensor_parallel.layers import param_is_not_tensor_parallel_duplicate
from megatron.core.transformer.module import param_is_not_shared

from .config import OptimConfig


def build_optimizer(model: torch.nn.Module, config: OptimConfig) -> torch.optim.AdamW:
    """AdamW; no weight decay on biases and norm weights (the 1-D parameters), as Megatron."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim <= 1]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.adam_beta1, config.adam_beta2),
                             eps=config.adam_eps, fused=next(model.parameters()).is_cuda)


@dataclass(frozen=True)
class Schedule:
    """Linear warmup to `lr`, then cosine decay to `min_lr` at `total` iterations."""

    lr: float
    min_lr: float
    warmup: int
    total: int

    @classmethod
    def of(cls, config: OptimConfig, total: int) -> Schedule:
        return cls(config.lr, config.min_lr, config.warmup_iters, total)

    def __call__(self, it: int) -> float:
        if it < self.warmup:
            return self.lr * (it + 1) / self.warmup
        progress = min(1.0, (it - self.warmup) / max(1, self.total - self.warmup))
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1 + math.cos(math.pi * progress))


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Global L2 norm of the gradients over the model-parallel group (TP × PP; a TP-replicated
    parameter, and the last stage's copy of tied embeddings, counted once), scaled down to
    `max_norm` if above (0 = measure only)."""
    grads = [p.grad for p in params if p.grad is not None]
    unique = [p.grad for p in params
              if p.grad is not None and param_is_not_tensor_parallel_duplicate(p) and param_is_not_shared(p)]
    norms = torch._foreach_norm(unique) if unique else [torch.zeros((), device=params[0].device)]
    norm_sq = torch.stack(norms).float().square().sum()
    if parallel_state.get_tensor_model_parallel_world_size() * parallel_state.get_pipeline_model_parallel_world_size() > 1:
        dist.all_reduce(norm_sq, group=parallel_state.get_model_parallel_group())
    norm = norm_sq.sqrt()
    if max_norm > 0:
        torch._foreach_mul_(grads, (max_norm / (norm + 1e-6)).clamp(max=1.0))
    return norm


def optimizer_step(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], lr: float,
                   max_norm: float) -> torch.Tensor:
    """Clip the gradients (`clip_grad_norm`), step at `lr`, clear them; → the norm before clipping."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    grad_norm = clip_grad_norm(params, max_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm
