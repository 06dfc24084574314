"""AdamW, its warmup + cosine learning rate, and the global gradient-norm clipping before each step.

Two optimizers with one interface (`params`, `step(lr)`, `moments()`, `load_moments()`,
`state_bytes()`), so the trainer and checkpoints treat them alike:
  `AdamW`             torch's AdamW over every parameter of this rank, its gradients made whole by
                      distributed.reduce_grads (torch DDP or none);
  `DistributedAdamW`  megatron-core's DistributedOptimizer over its DistributedDataParallel: the
                      moments sharded over data parallelism (ZeRO-1), gradients reduce-scattered and
                      parameters all-gathered, optionally overlapping backward and forward.
A checkpoint holds each parameter's moments whole (`moments`), so a run saved with either, at any
data-parallel size, resumes with either at any other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.tensor_parallel.layers import param_is_not_tensor_parallel_duplicate
from megatron.core.transformer.module import param_is_not_shared

from .config import OptimConfig
from .model import is_expert_parallel

MOMENTS = ("exp_avg", "exp_avg_sq")  # AdamW's state of a parameter besides its step count


class AdamW:
    """torch's AdamW; no weight decay on biases and norm weights (the 1-D parameters), as Megatron."""

    def __init__(self, model: torch.nn.Module, config: OptimConfig) -> None:
        params = [p for p in model.parameters() if p.requires_grad]
        decay = [p for p in params if p.ndim > 1]
        no_decay = [p for p in params if p.ndim <= 1]
        self.params = decay + no_decay  # in the order of torch's state_dict
        groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        self.clip_grad = config.clip_grad
        self.torch = torch.optim.AdamW(groups, lr=config.lr, betas=(config.adam_beta1, config.adam_beta2),
                                       eps=config.adam_eps, fused=self.params[0].is_cuda)

    def step(self, lr: float) -> torch.Tensor:
        """Clip the gradients (`clip_grad_norm`), step at `lr`, clear them; → the norm before clipping."""
        for group in self.torch.param_groups:
            group["lr"] = lr
        grad_norm = clip_grad_norm(self.params, self.clip_grad)
        self.torch.step()
        self.torch.zero_grad(set_to_none=True)
        return grad_norm

    def state_bytes(self) -> int:
        """The moments this rank holds (as they will be once the first step made them)."""
        return len(MOMENTS) * sum(p.numel() * 4 for p in self.params)

    def moments(self) -> list[dict[str, torch.Tensor]]:
        """Each of `params`' moments, shaped like it (zeros before the first step)."""
        return [{k: self.torch.state.get(p, {}).get(k, torch.zeros_like(p)) for k in MOMENTS} for p in self.params]

    def load_moments(self, moments: list[dict[str, torch.Tensor]], steps: int) -> None:
        state = {i: {**m, "step": torch.tensor(float(steps))} for i, m in enumerate(moments)}
        self.torch.load_state_dict({"state": state, "param_groups": self.torch.state_dict()["param_groups"]})


class DistributedAdamW:
    """megatron-core's DistributedOptimizer (AdamW; torch's where Transformer Engine and Apex are
    missing) over `model`, a megatron-core DistributedDataParallel with use_distributed_optimizer.

    Each data-parallel rank keeps the moments of its 1/DP of every gradient bucket. Parameters stay
    float32 (autocast runs them in bf16), so the optimizer's main parameters are views of them.
    Clipping and the gradient norm are megatron-core's own (over every rank of the optimizer)."""

    def __init__(self, model: torch.nn.Module, config: OptimConfig) -> None:
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        self.params = [p for p in model.module.parameters() if p.requires_grad]
        self.weight_decay = config.weight_decay
        self.megatron = get_megatron_optimizer(OptimizerConfig(
            optimizer="adam", lr=config.lr, min_lr=config.min_lr, weight_decay=config.weight_decay,
            adam_beta1=config.adam_beta1, adam_beta2=config.adam_beta2, adam_eps=config.adam_eps,
            clip_grad=config.clip_grad, params_dtype=torch.float32, use_distributed_optimizer=True), [model])
        # One DistributedOptimizer for dense models (megatron-core may chain it with others).
        chained = getattr(self.megatron, "chained_optimizers", [self.megatron])
        self.shards = [o for o in chained if o.param_groups]

    def step(self, lr: float) -> torch.Tensor:
        """Step at `lr` (the gradients already reduce-scattered by finalize_model_grads); → the norm
        before clipping. Groups carry megatron-core's multipliers: biases and norms have wd_mult 0."""
        for group in self.megatron.param_groups:
            group["lr"] = lr * group.get("lr_mult", 1.0)
            group["weight_decay"] = self.weight_decay * group.get("wd_mult", 1.0)
        _, grad_norm, _ = self.megatron.step()
        self.megatron.zero_grad()
        return torch.as_tensor(grad_norm)

    def _owned(self):
        """(parameter, its flat range this rank owns, the optimizer's state of that range, the torch
        optimizer holding it) for every parameter of which this rank owns a part."""
        for optimizer in self.shards:
            for p in self.params:
                if p not in optimizer.model_param_gbuf_map:
                    continue
                owned = optimizer._get_model_param_range_map(p)["param"]
                if owned.size:
                    yield p, owned, optimizer._get_main_param_and_optimizer_states(p), optimizer.optimizer

    def state_bytes(self) -> int:
        return len(MOMENTS) * sum(owned.size * 4 for _, owned, _, _ in self._owned())

    def moments(self) -> list[dict[str, torch.Tensor]]:
        """Whole moments on the CPU, gathered from the data-parallel ranks (each adds its part to
        zeros, then one sum per parameter)."""
        parts = {p: (owned, state) for p, owned, state, _ in self._owned()}
        group = parallel_state.get_data_parallel_group()
        whole = []
        for p in self.params:
            moments = {}
            for k in MOMENTS:
                flat = torch.zeros(p.numel(), dtype=torch.float32, device=p.device)
                if p in parts and k in parts[p][1]:
                    owned, state = parts[p]
                    flat[owned.start:owned.end] = state[k]
                dist.all_reduce(flat, group=group)
                moments[k] = flat.view(p.shape).cpu()
            whole.append(moments)
        return whole

    def load_moments(self, moments: list[dict[str, torch.Tensor]], steps: int) -> None:
        """Each rank's part of whole moments into its shard's state; the main parameters are
        views of the (already loaded) model parameters."""
        index = {p: i for i, p in enumerate(self.params)}
        for p, owned, state, inner in self._owned():
            main = state["param"]
            inner.state[main] = {k: moments[index[p]][k].reshape(-1)[owned.start:owned.end].to(main.device).clone()
                                 for k in MOMENTS}
            inner.state[main]["step"] = torch.tensor(float(steps))


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
    parameter, and the last stage's copy of tied embeddings, counted once; expert-parallel ranks'
    experts, each its own, summed over their group too), scaled down to `max_norm` if above (0 =
    measure only)."""
    grads = [p.grad for p in params if p.grad is not None]
    norm_sq = torch.zeros((), device=params[0].device)
    for experts, group in ((False, parallel_state.get_model_parallel_group()),
                           (True, parallel_state.get_expert_tensor_model_pipeline_parallel_group())):
        if experts and parallel_state.get_expert_model_parallel_world_size() == 1:
            continue  # no expert-parallel parameter
        unique = [p.grad for p in params if p.grad is not None and is_expert_parallel(p) == experts
                  and param_is_not_tensor_parallel_duplicate(p) and param_is_not_shared(p)]
        part = torch.stack(torch._foreach_norm(unique)).float().square().sum() if unique else torch.zeros_like(norm_sq)
        if dist.get_world_size(group) > 1:
            dist.all_reduce(part, group=group)
        norm_sq += part
    norm = norm_sq.sqrt()
    if max_norm > 0:
        torch._foreach_mul_(grads, (max_norm / (norm + 1e-6)).clamp(max=1.0))
    return norm
