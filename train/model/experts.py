"""A mixture-of-experts layer: its experts as two grouped matrix products, its tokens sent in the
compute dtype.

megatron-core's SequentialMLP runs each local expert's MLP in turn: for Qwen3-30B-A3B's 128 experts
at micro batch 1 that is 256 small products of a few dozen tokens each and a Python loop, a few
percent of the GPU (bench/results/gpu/2026-11-29-moe.md). Its grouped alternative, TEGroupedMLP, needs
Transformer Engine and stores each linear's experts as weight0..weightN, another checkpoint layout.
GroupedExperts keeps SequentialMLP's modules and parameters (checkpoints, Hugging Face mapping,
expert parallelism, initialization unchanged) and computes all local experts at once with torch's
grouped GEMM (`torch._grouped_mm`: CUTLASS on Hopper, a loop on the CPU), which needs no token
padding in bf16.

A token meets 8 of 128 experts, so the experts' weights are 16 times their share of the products:
casting each expert's float32 weight, every micro-batch, took more GPU time than the grouped
products themselves (bench/README.md). Inside `weights_shared` (a step's schedule) each linear's
stack is made once, by one fused copy, and its micro-batches use it.

Under --fp32-residual-connection the residual stream is float32, and so were the tokens the dispatcher
permutes and sends to other expert-parallel ranks, though the experts compute in bf16:
AutocastDispatchMoELayer sends them in bf16, half the bytes (the router reads the stream in float32,
`patches.autocast.moe_router_outside_autocast`)."""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
import torch.nn.functional as F
from megatron.core.fusions.fused_bias_swiglu import weighted_bias_swiglu_impl
from megatron.core.transformer.moe.experts import SequentialMLP
from megatron.core.transformer.moe.moe_layer import MoELayer


class _GroupedLinear(torch.autograd.Function):
    """x @ stack[e].T for each expert e's rows of x (rows offsets[e-1]:offsets[e]). `stack` is the
    experts' weights cast and stacked, made outside autograd; the gradient of `weights` (each
    expert's own parameter) is the matching slice of the stack's."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, offsets: torch.Tensor, stack: torch.Tensor, *weights: torch.Tensor):
        ctx.save_for_backward(x, offsets, stack)
        ctx.weight_dtype = weights[0].dtype
        return torch._grouped_mm(x, stack.transpose(1, 2), offs=offsets)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, offsets, stack = ctx.saved_tensors
        grad_x = torch._grouped_mm(grad, stack, offs=offsets)
        # [experts, out, in] at once; one cast for all of them, slices autograd adds to each .grad
        grad_stack = torch._grouped_mm(grad.t(), x, offs=offsets).to(ctx.weight_dtype)
        return grad_x, None, None, *grad_stack.unbind(0)


class GroupedExperts(SequentialMLP):
    """SequentialMLP's experts, computed as SequentialMLP computes them (SwiGLU, the routing
    probability applied after the activation), with one grouped product per linear layer."""

    stacks: Optional[dict] = None  # inside `weights_shared`: (linear, dtype) → its experts' stack

    def forward(self, hidden: torch.Tensor, tokens_per_expert: torch.Tensor, probs: torch.Tensor):
        config, device = self.config, hidden.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        # CUDA's grouped GEMM takes bf16 only; the rest is what the sequential experts handle.
        if (self.num_local_experts == 1 or (device == "cuda" and dtype != torch.bfloat16) or config.fp8
                or config.moe_apply_probs_on_input or not config.gated_linear_unit
                or config.activation_func is not F.silu):
            return super().forward(hidden, tokens_per_expert, probs)
        # Local expert e's tokens are rows offsets[e-1]:offsets[e] of `hidden` (the dispatcher's order).
        offsets = torch.cumsum(tokens_per_expert.to(hidden.device), 0, dtype=torch.int32)
        fc1 = [expert.linear_fc1.weight for expert in self.local_experts]
        fc2 = [expert.linear_fc2.weight for expert in self.local_experts]
        inner = _GroupedLinear.apply(hidden.to(dtype), offsets, self._stack("fc1", fc1, dtype), *fc1)
        if config.bias_activation_fusion:  # megatron-core's compiled kernel, as the MLP uses it
            inner = weighted_bias_swiglu_impl(inner, None, probs.unsqueeze(-1), config.activation_func_fp8_input_store)
        else:
            gate, up = inner.chunk(2, dim=-1)
            inner = (F.silu(gate) * up * probs.unsqueeze(-1)).to(dtype)
        return _GroupedLinear.apply(inner, offsets, self._stack("fc2", fc2, dtype), *fc2), None

    def _stack(self, linear: str, weights: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """[experts, out, in] of `dtype`: `weights` cast into one tensor (no float32 stack is held);
        inside `weights_shared`, made once and kept."""
        key = (linear, dtype)
        if self.stacks is not None and key in self.stacks:
            return self.stacks[key]
        stack = torch.empty((len(weights), *weights[0].shape), dtype=dtype, device=weights[0].device)
        with torch.no_grad():
            torch._foreach_copy_(list(stack.unbind(0)), weights)
        if self.stacks is not None:
            self.stacks[key] = stack
        return stack


@contextlib.contextmanager
def weights_shared(model: torch.nn.Module) -> Iterator[None]:
    """Inside the block every GroupedExperts of `model` stacks its weights once and reuses the
    stacks: for a step's schedule, whose micro-batches (and recomputes) all run on the same weights.
    The stacks are dropped on leaving it, before the optimizer or a load changes the weights."""
    experts = [m for m in model.modules() if isinstance(m, GroupedExperts)]
    for m in experts:
        m.stacks = {}
    try:
        yield
    finally:
        for m in experts:
            m.stacks = None


class AutocastDispatchMoELayer(MoELayer):
    """megatron-core's MoE layer, its tokens cast to autocast's dtype after routing and before the
    dispatcher permutes and sends them: the experts compute in that dtype anyway."""

    @torch.compiler.disable  # a compiled layer runs its attention compiled and this eager: the dispatcher
    def forward(self, *args, **kwargs):  # waits on the host for token counts and records CUDA streams
        return super().forward(*args, **kwargs)

    def preprocess(self, hidden_states: torch.Tensor, probs: torch.Tensor, routing_map: torch.Tensor):
        device = hidden_states.device.type
        if torch.is_autocast_enabled(device):
            hidden_states = hidden_states.to(torch.get_autocast_dtype(device))
        return super().preprocess(hidden_states, probs, routing_map)
