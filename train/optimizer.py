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

`AdamW(bf16_weights=True)` keeps each dense matrix as the bf16 weight the model computes with plus
the 16 bits float32 has besides (`split_float32`): the same memory as a float32 parameter, the same
float32 master for AdamW, and no cast of every weight at every use. (Under bf16 autocast a float32
matrix is cast to bf16 in each micro-batch's forward and again in its backward, and its bf16
gradient converted and added to the float32 one.) The trainer's default where it is built
(plan.bf16_weights_unbuilt); measured in docs/performance.md, "bf16 weights by default".
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.tensor_parallel.layers import param_is_not_tensor_parallel_duplicate
from megatron.core.transformer.module import param_is_not_shared

from .config import OptimConfig
from . import kernels, marks
from .marks import is_expert_parallel

MOMENTS = ("exp_avg", "exp_avg_sq")  # AdamW's state of a parameter besides its step count


class AdamW:
    """torch's AdamW; no weight decay on biases and norm weights (the 1-D parameters), as Megatron.

    With `bf16_weights` the dense matrices (`splittable`) are split: the model holds their bf16
    part, `low` the rest, `float32_grad` their float32 gradient (their bf16 one is added to it as soon
    as backward makes it). torch's AdamW steps them joined again, float32 during the step only."""

    def __init__(self, model: torch.nn.Module, config: OptimConfig, bf16_weights: bool = False,
                 in_place: bool = False, fused: Optional[bool] = None) -> None:
        """`in_place`: every weight and gradient stays in the memory it has (a CUDA graph reads and
        writes them there, graphs.py): gradients are zeroed, not dropped, and the split weights'
        bf16 parts are written back where they were. `fused` (default: on CUDA with the Triton
        kernels): each parameter stepped by kernels.adamw_, in place, the clipping's factor and the
        zeroing in its pass; else torch's fused AdamW over the joined masters (`_joined_step`)."""
        params = [p for p in model.parameters() if p.requires_grad]
        decay = [p for p in params if p.ndim > 1]
        no_decay = [p for p in params if p.ndim <= 1]
        self.params = decay + no_decay  # in the order of torch's state_dict
        groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        self.clip_grad, self.in_place = config.clip_grad, in_place
        self.fused = kernels.enabled(self.params[0]) if fused is None else fused
        self.torch = torch.optim.AdamW(groups, lr=config.lr, betas=(config.adam_beta1, config.adam_beta2),
                                       eps=config.adam_eps, fused=self.params[0].is_cuda and not self.fused)
        names = {p: name for name, p in model.named_parameters()}
        self.split = [p for p in decay if bf16_weights and splittable(names[p], p)]
        for p in self.split:
            p.data, low = split_float32(p.data)
            marks.mark_low_bits(p, low)
            marks.mark_float32_grad(p, torch.zeros(p.shape, dtype=torch.float32, device=p.device))
            p.register_post_accumulate_grad_hook(_add_to_float32_grad)
        if self.split and self.split[0].is_cuda:  # compiled here, never inside a graph's capture
            total = marks.float32_grad(self.split[0])
            _fused(_add_in_place)(total.view(-1), torch.zeros(total.numel(), dtype=torch.bfloat16, device=total.device))

    def step(self, lr: float) -> torch.Tensor:
        """Clip the gradients (`clip_grad_norm`), step at `lr`, clear them; → the norm before clipping."""
        for group in self.torch.param_groups:
            group["lr"] = lr
        grads = [marks.gradient(p) for p in self.params]
        if not self.fused:
            return self._joined_step(grads)
        norm = grad_norm(self.params, grads)
        coef = clip_coefficient(norm, self.clip_grad) if self.clip_grad > 0 else torch.ones_like(norm)
        self._fused_step(lr, grads, coef)
        return norm

    def _joined_step(self, grads: list[Optional[torch.Tensor]]) -> torch.Tensor:
        grad_norm = clip_grad_norm(self.params, grads, self.clip_grad)
        with self.float32_weights():
            for p in self.split:
                p.grad = marks.float32_grad(p)
            self.torch.step()
            for p in self.split:
                p.grad = None  # their float32 gradients are zeroed below; backward adds to them again
            self.torch.zero_grad(set_to_none=not self.in_place)
        if self.split:
            torch._foreach_zero_([marks.float32_grad(p) for p in self.split])
        return grad_norm

    def _fused_step(self, lr: float, grads: list[Optional[torch.Tensor]], coef: torch.Tensor) -> None:
        """kernels.adamw_ over each parameter with a gradient, its moments in torch's state (as its
        AdamW keeps them: `moments`, checkpoints); the step counts there on the host (no device
        read). Gradients zeroed in the pass (split weights' float32 ones always), or dropped after."""
        (beta1, beta2), eps = self.torch.defaults["betas"], self.torch.defaults["eps"]
        gradient = {id(p): g for p, g in zip(self.params, grads)}
        for group in self.torch.param_groups:
            for p in group["params"]:
                grad = gradient[id(p)]
                if grad is None:
                    continue
                state = self._state(p)
                state["step"] += 1
                scalars = kernels.AdamWStep(lr, beta1, beta2, eps, group["weight_decay"], int(state["step"]))
                split = marks.float32_grad(p) is not None
                kernels.adamw_(p.data, marks.low_bits(p), grad, state["exp_avg"], state["exp_avg_sq"], coef, scalars,
                               zero_grad=split or self.in_place)
                if not (split or self.in_place):
                    p.grad = None

    def _state(self, p: torch.nn.Parameter) -> dict:
        """p's AdamW state, made at its first step: the step count (a CPU tensor) and float32 moments."""
        state = self.torch.state[p]
        if "step" not in state:
            state.update(step=torch.tensor(0.0), exp_avg=torch.zeros(p.shape, dtype=torch.float32, device=p.device),
                         exp_avg_sq=torch.zeros(p.shape, dtype=torch.float32, device=p.device))
        elif state["step"].device.type != "cpu":  # as torch's load_state_dict leaves it (its fused AdamW's)
            state["step"] = state["step"].cpu()
        return state

    @contextlib.contextmanager
    def float32_weights(self) -> Iterator[None]:
        """The split matrices float32 inside the block (AdamW steps them, checkpoints and exports
        read them, loading writes them), each in the memory its two parts free; split again after."""
        kept = [p.data for p in self.split] if self.in_place else []
        for p in self.split:
            p.data = join_float32(p.data, marks.low_bits(p))
            marks.mark_low_bits(p, None)
        try:
            yield
        finally:
            for i, p in enumerate(self.split):
                p.data, low = split_float32(p.data)
                if kept:
                    p.data = kept[i].copy_(p.data)
                marks.mark_low_bits(p, low)

    def state_bytes(self) -> int:
        """The moments this rank holds (as they will be once the first step made them)."""
        return len(MOMENTS) * sum(p.numel() * 4 for p in self.params)

    def moments(self) -> list[dict[str, torch.Tensor]]:
        """Each of `params`' moments, shaped like it (float32 zeros before the first step)."""
        state = self.torch.state
        return [{k: state.get(p, {}).get(k, torch.zeros(p.shape, device=p.device)) for k in MOMENTS}
                for p in self.params]

    def load_moments(self, moments: list[dict[str, torch.Tensor]], steps: int) -> None:
        state = {i: {**m, "step": torch.tensor(float(steps))} for i, m in enumerate(moments)}
        with self.float32_weights():  # torch's load_state_dict casts the moments to each parameter's dtype
            self.torch.load_state_dict({"state": state, "param_groups": self.torch.state_dict()["param_groups"]})


def splittable(name: str, p: torch.nn.Parameter) -> bool:
    """A dense float32 matrix the model multiplies by under autocast: not the embedding table
    (looked up, never cast whole) nor its tied copy on the last pipeline stage, nor an expert's
    (reduced over its own group)."""
    return (p.dtype == torch.float32 and p.ndim == 2 and not name.endswith("word_embeddings.weight")
            and not marks.is_shared_embedding(p) and not is_expert_parallel(p))


def split_float32(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 → (its bf16 rounding, as torch casts it: to nearest, ties to even; the int16 that
    `join_float32` adds back to make it again).

    One case does not fit: a tie rounded down (the rest would be +0x8000). It is kept 1 unit of
    float32's last place lower (+0x7FFF), a number that rounds to the same bf16: 1 weight in 131,072
    moves by 6e-8 of itself, and the bf16 weight is still the cast of the float32 one."""
    return (_fused(kernels.split_bits) if x.is_cuda else kernels.split_bits)(x)


def join_float32(high: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    return (_fused(kernels.join_bits) if high.is_cuda else kernels.join_bits)(high, low)


@functools.cache
def _fused(fn):
    """`fn` compiled to one kernel reading its inputs once and writing its outputs once. Every step
    joins and splits each split matrix again; eager, each integer step writes its own int32 tensor,
    ten passes over memory where one does."""
    return torch.compile(fn, dynamic=True, fullgraph=True)


def _add_to_float32_grad(p: torch.nn.Parameter) -> None:
    if p.grad is not None:  # (None where the fused cross-entropy added the output weight's already)
        accumulate(marks.float32_grad(p), p.grad)
        p.grad = None


def accumulate(total: torch.Tensor, grad: torch.Tensor) -> None:
    """total += grad, a float32 tensor and a bf16 one of its shape. torch's add of two dtypes takes
    its slow CUDA path (each element cast on its own, no vector loads): 7.3 ms of a 0.5B step at
    micro batch 4 for its 200 adds. Compiled, one vectorised kernel (2.4 ms), which a CUDA graph
    replays; called eagerly, its ~80 us of host time a call would outweigh that, and the eager
    add stays."""
    if total.is_cuda and grad.is_contiguous() and torch.cuda.is_current_stream_capturing():
        _fused(_add_in_place)(total.view(-1), grad.view(-1))
    else:
        total.add_(grad)


def _add_in_place(total: torch.Tensor, grad: torch.Tensor) -> None:
    total.add_(grad)


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

    def float32_weights(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # the model's parameters are float32 throughout

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


def clip_grad_norm(params: list[torch.nn.Parameter], grads: list[torch.Tensor | None],
                   max_norm: float) -> torch.Tensor:
    """`grad_norm`, the gradients scaled down to `max_norm` if above (0 = measure only)."""
    norm = grad_norm(params, grads)
    if max_norm > 0:
        torch._foreach_mul_([g for g in grads if g is not None], clip_coefficient(norm, max_norm))
    return norm


def clip_coefficient(norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """What clipping multiplies the gradients by: 1, or less where `norm` is above `max_norm`."""
    return (max_norm / (norm + 1e-6)).clamp(max=1.0)


def grad_norm(params: list[torch.nn.Parameter], grads: list[torch.Tensor | None]) -> torch.Tensor:
    """Global L2 norm of the gradients (`grads`, each of `params`') over the model-parallel group
    (TP × PP; a TP-replicated parameter, and the last stage's copy of tied embeddings, counted once;
    expert-parallel ranks' experts, each its own, summed over their group too)."""
    norm_sq = torch.zeros((), device=params[0].device)
    for experts, group in ((False, parallel_state.get_model_parallel_group()),
                           (True, parallel_state.get_expert_tensor_model_pipeline_parallel_group())):
        if experts and parallel_state.get_expert_model_parallel_world_size() == 1:
            continue  # no expert-parallel parameter
        unique = [g for p, g in zip(params, grads) if g is not None and is_expert_parallel(p) == experts
                  and param_is_not_tensor_parallel_duplicate(p) and param_is_not_shared(p)]
        part = torch.stack(torch._foreach_norm(unique)).float().square().sum() if unique else torch.zeros_like(norm_sq)
        if dist.get_world_size(group) > 1:
            dist.all_reduce(part, group=group)
        norm_sq += part
    return norm_sq.sqrt()
