"""Our layers in megatron-core's local spec: each replaces one of its modules (converters.py says
where) and keeps its parameters, so checkpoints and Hugging Face exports are unchanged."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.tensor_parallel.layers import RowParallelLinear, _initialize_affine_weight_cpu
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.attention import SelfAttention
from megatron.core.transformer.transformer_layer import TransformerLayer
from megatron.core.utils import get_pg_rank, get_pg_size

from ..attention import takes_batch_major
from ..marks import mark_sequence_parallel


class GroupedRowParallelLinear(RowParallelLinear):
    """megatron-core's RowParallelLinear, handing its matmul the layer's own tensor-parallel group.

    The original passes `tp_group=None`, and the matmul then looks the same default group up with a
    DeprecationWarning on rank 0: a `warnings.warn` that torch.compile cannot trace, so every
    compiled layer broke into several graphs around its two row-parallel linears (attention output
    and MLP down projection). The group only matters to the matmul for sequence parallelism and
    gradient all-reduce, which a row-parallel linear does outside it, so the result is unchanged.
    """

    def _forward_impl(self, input, weight, *args, **kwargs):
        if kwargs.get("tp_group") is None:
            kwargs["tp_group"] = self.tp_group
        if batch_major(input) and not (self.sequence_parallel or self.explicit_expert_comm):
            # [s, b, h] rows in [b, s, h] memory (Transformer Engine's THD attention's output): multiplied
            # as they lie and handed on as a view of the same order, where the matmul would have copied
            # them into [s, b] order first, and its backward again for the weight's gradient.
            # Row by row, the same products; not under sequence parallelism, which scatters along s.
            return super()._forward_impl(input.transpose(0, 1), weight, *args, **kwargs).transpose(0, 1)
        return super()._forward_impl(input, weight, *args, **kwargs)


def batch_major(x: torch.Tensor) -> bool:
    """Whether [s, b, ...] `x` lies in [b, s, ...] memory (and not in both orders: b or s of 1)."""
    return x.dim() >= 3 and not x.is_contiguous() and x.transpose(0, 1).is_contiguous()


class SeededTransformerLayer(TransformerLayer):
    """megatron-core's TransformerLayer, its weights drawn from `init_seed` and its global layer
    number alone: a pipeline stage builds only its own layers, and without this a layer's weights
    would depend on how many were built before it on the same rank."""

    def __init__(self, config, submodules, layer_number: int = 1, *args, init_seed: int = 0, layer_offset: int = 0,
                 **kwargs):
        number = layer_number + layer_offset
        torch.manual_seed(init_seed * 1_000_003 + number)
        super().__init__(config, submodules, layer_number, *args, **kwargs)
        assert self.layer_number == number, "megatron-core numbers this layer otherwise"
        if config.num_moe_experts and config.use_cpu_initialization:
            self._draw_each_expert(init_seed * 1_000_003 + number)

    def _draw_each_expert(self, seed: int) -> None:
        """Each expert's weights drawn again from `seed` and its global number: a rank builds only
        its expert-parallel share of the experts, whose draws would otherwise start where expert 0's
        do, and leave torch's generator elsewhere for the next module. By megatron-core's own
        initialization (the init method of each linear, the whole matrix drawn and this
        tensor-parallel rank's part kept, as the linear was built)."""
        local = self.mlp.experts.local_experts
        first = parallel_state.get_expert_model_parallel_rank() * len(local)
        for number, expert in enumerate(local, start=first):
            torch.manual_seed(seed * 1_000_003 + 1 + number)
            for linear, init in ((expert.linear_fc1, self.config.init_method),
                                 (expert.linear_fc2, self.config.output_layer_init_method)):
                weight, world = linear.weight, get_pg_size(linear.tp_group)
                dim = weight.partition_dim
                whole = [n * world if d == dim else n for d, n in enumerate(weight.shape)]
                drawn = torch.empty_like(weight)  # megatron marks the tensor it draws: a fresh one
                _initialize_affine_weight_cpu(drawn, *whole, weight.shape[dim], dim, init,
                                              stride=weight.partition_stride, params_dtype=weight.dtype,
                                              rank=get_pg_rank(linear.tp_group), world_size=world)
                weight.data.copy_(drawn)
        torch.manual_seed(seed * 1_000_003)  # what is drawn after this layer (the output layer) alike too


class RMSNorm(torch.nn.Module):
    """RMSNorm for megatron-core's local spec under sequence parallelism, which its own torch
    wrapper refuses.

    A norm of the sequence-split stream (`sequence_split`: before attention, before the MLP, the
    final one) marks its weight `sequence_parallel`, and the trainer sums its gradient over the
    tensor-parallel group (`distributed.sum_partial_grads`). Its output feeds a column-parallel linear,
    which gathers it over the group and in backward reduce-scatters a gradient of the input's
    dtype; under autocast that gradient is bf16, so the output is cast to autocast's dtype (what
    the linear computes in anyway). Qwen3's QK norms see whole sequences and stay as they are.
    """

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-6, *,
                 sequence_split: bool = True) -> None:
        super().__init__()
        self.eps, self.sequence_split = eps, sequence_split
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        mark_sequence_parallel(self.weight, sequence_split)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        if self.sequence_split and torch.is_autocast_enabled(x.device.type):
            out = out.to(torch.get_autocast_dtype(x.device.type))
        return out


def fp8_linear(name: str) -> type:
    """megatron-core's Transformer Engine linear `name`, called outside torch.compile's graphs:
    dynamo cannot trace TE's FP8 tensors ("'Float8Tensor' object has no attribute '_data'", torch
    2.11, TE 2.20), and so a compiled layer keeps its norms, RoPE, attention and SwiGLU fused
    around the FP8 matrix multiplications, as in bf16."""
    from megatron.core.extensions import transformer_engine

    return outside_graph(getattr(transformer_engine, name))


@functools.cache
def outside_graph(linear: type) -> type:
    """`linear` with its forward run eagerly inside a compiled layer: one class for every layer
    (the compiled layers guard on their modules' types)."""
    return type(linear.__name__, (linear,), {"forward": torch.compiler.disable(linear.forward), "__module__": __name__})


class FP8SelfAttention(SelfAttention):
    """megatron-core's SelfAttention around linears that run outside the graph (`fp8_linear`),
    its query's and key's RoPE compiled once for both.

    megatron-core calls the QKV and output linears inside its activation-offloading context
    manager, and dynamo cannot resume after a graph break inside a context manager it does not
    know: it runs this forward eagerly and compiles what the forward calls one by one. RoPE is
    then compiled for the query and again for the key, which has fewer heads (grouped-query
    attention) and, a view of the QKV output, other strides. Both handed over contiguous, their
    head count marked dynamic, share one graph."""

    @torch.compiler.disable(recursive=False)  # eager anyway (above); here the marks can be set
    def get_query_key_value_tensors(self, *args, **kwargs):
        qkv = super().get_query_key_value_tensors(*args, **kwargs)
        if not kwargs.get("split_qkv", True):  # the fused QKV RoPE's one tensor
            return qkv
        query, key, *rest = qkv
        query, key = query.contiguous(), key.contiguous()
        for heads_first in (query, key):  # [s, b, heads, head dim]
            torch._dynamo.maybe_mark_dynamic(heads_first, 2)
        return (query, key, *rest)


class FusedQKVSelfAttention(SelfAttention):
    """megatron-core's SelfAttention under `fused_single_qkv_rope` (model/transformer.py), its QKV
    projection's bias handed on beside the product instead of added to it, so that one kernel adds it,
    splits the heads, rotates the query and key and casts all three for attention
    (patches/rope.py: `fused_qkv_rope`, train/kernels.py: `qkv_rope`). Under autocast the product is
    bf16 and the bias float32: added by the linear, their float32 sum was written and read again
    (inductor fuses the add into its own split and rotation, but not into an opaque kernel)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.linear_qkv.skip_bias_add = True  # the linear returns (product, bias); the parameters are the same
        self.batch_major = False  # this call's core attention takes its rows batch-major (`forward`)
        if hasattr(self.core_attention, "thd_batch_major"):  # TE's: told that they come [b, s, ...] then
            self.core_attention.thd_batch_major = True

    def forward(self, hidden_states, attention_mask=None, *args, **kwargs):
        """megatron-core's; the query, key and value written [b, s, heads, d] for a core attention that
        takes them so (attention.takes_batch_major: Transformer Engine's THD stream of packed rows), which
        would otherwise copy them into that order. They cross the compiled layer's break at TE's call
        contiguous, so their gradients come back as they lie (kernels.qkv_rope)."""
        self.batch_major = takes_batch_major(attention_mask)
        return super().forward(hidden_states, attention_mask, *args, **kwargs)

    def get_query_key_value_tensors(self, hidden_states, key_value_states=None, output_gate=False, split_qkv=True):
        """((mixed [s, b, groups, (q + 2)·d], bias or None, batch-major), [q·d, d, d]): what megatron-core
        hands `apply_fused_qkv_rotary_pos_emb`, the bias and the outputs' order with it. megatron-core
        takes the unsplit path whenever the config asks for it and it can (no QK norm, no packed THD
        parameters, not inferring): where it could not, the layer would have lost its bias, so that is
        refused."""
        if split_qkv or output_gate or self.config.num_query_groups < self.world_size:
            raise ValueError("FusedQKVSelfAttention runs megatron-core's fused_single_qkv_rope path only")
        mixed, bias = self.linear_qkv(hidden_states)
        groups, d = self.num_query_groups_per_partition, self.hidden_size_per_attention_head
        q = self.num_attention_heads_per_partition // groups
        return (mixed.view(*mixed.shape[:-1], groups, (q + 2) * d), bias, self.batch_major), [q * d, d, d]
