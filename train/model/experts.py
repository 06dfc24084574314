"""A mixture-of-experts layer's experts as two grouped matrix products.

megatron-core's SequentialMLP runs each local expert's MLP in turn: for Qwen3-30B-A3B's 128 experts
at micro batch 1 that is 256 small products of a few dozen tokens each and a Python loop, a few
percent of the GPU (bench/results/gpu/moe.json). Its grouped alternative, TEGroupedMLP, needs
Transformer Engine and stores each linear's experts as weight0..weightN, another checkpoint layout.
GroupedExperts keeps SequentialMLP's modules and parameters (checkpoints, Hugging Face mapping,
expert parallelism, initialization unchanged) and computes all local experts at once with torch's
grouped GEMM (`torch._grouped_mm`: CUTLASS on Hopper, a loop on the CPU), which needs no token
padding in bf16."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.fusions.fused_bias_swiglu import weighted_bias_swiglu_impl
from megatron.core.transformer.moe.experts import SequentialMLP


class GroupedExperts(SequentialMLP):
    """SequentialMLP's experts, computed as SequentialMLP computes them (SwiGLU, the routing
    probability applied after the activation), with one grouped product per linear layer."""

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
        # Each weight cast before stacking: the float32 stack of all experts is never held.
        fc1 = torch.stack([expert.linear_fc1.weight.to(dtype) for expert in self.local_experts])
        fc2 = torch.stack([expert.linear_fc2.weight.to(dtype) for expert in self.local_experts])
        inner = torch._grouped_mm(hidden.to(dtype), fc1.transpose(1, 2), offs=offsets)
        if config.bias_activation_fusion:  # megatron-core's compiled kernel, as the MLP uses it
            inner = weighted_bias_swiglu_impl(inner, None, probs.unsqueeze(-1), config.activation_func_fp8_input_store)
        else:
            gate, up = inner.chunk(2, dim=-1)
            inner = (F.silu(gate) * up * probs.unsqueeze(-1)).to(dtype)
        return torch._grouped_mm(inner, fc2.transpose(1, 2), offs=offsets), None
