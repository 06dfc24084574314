"""Converters of megatron-core's local layer spec: each a function spec → spec that swaps some of
its modules for ours, the parameters unchanged (their names, shapes and initialization), so a
checkpoint or Hugging Face export reads the same whatever converters built the model. spec.py
applies them in order; a later one may replace what an earlier one put (FP8 linears over the
grouped row-parallel ones)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

from megatron.core.transformer.spec_utils import ModuleSpec

from ..attention import SDPACoreAttention, TECoreAttention, TEPackedCoreAttention
from .experts import AutocastDispatchMoELayer, GroupedExperts
from .layers import (FP8SelfAttention, FusedQKVSelfAttention, GroupedRowParallelLinear, RMSNorm, SeededTransformerLayer,
                     fp8_linear)

Converter = Callable[[ModuleSpec], ModuleSpec]

CORE_ATTENTION = {"sdpa": SDPACoreAttention, "te": TECoreAttention}  # local: the spec's own


def _submodules(spec):
    """A ModuleSpec's submodules (megatron-core 0.19 gives some specs as functools.partial)."""
    return spec.keywords["submodules"] if isinstance(spec, functools.partial) else spec.submodules


def _with_module(spec, module: type):
    """`spec` building `module` instead (megatron-core 0.19 gives some specs as functools.partial)."""
    if isinstance(spec, functools.partial):
        return functools.partial(module, *spec.args, **spec.keywords)
    return dataclasses.replace(spec, module=module)


def attention_parts(spec: ModuleSpec):
    return spec.submodules.self_attention.submodules


def mlp_parts(spec: ModuleSpec):
    """The MLP's linears: of a mixture of experts' layer, each expert's."""
    mlp = _submodules(spec.submodules.mlp)
    return _submodules(mlp.experts) if hasattr(mlp, "experts") else mlp


def seeded_layers(seed: int, offset: int = 0) -> Converter:
    """Each layer's weights drawn from `seed` and its global number (SeededTransformerLayer): its
    number in the stage after the `offset` layers of the stages before."""
    def convert(spec):
        spec.module = SeededTransformerLayer
        spec.params = {**spec.params, "init_seed": seed, "layer_offset": offset}
        return spec
    return convert


def grouped_experts(spec: ModuleSpec) -> ModuleSpec:
    """A mixture of experts' experts computed by grouped GEMM (experts.py)."""
    mlp = _submodules(spec.submodules.mlp)
    mlp.experts = _with_module(mlp.experts, GroupedExperts)
    return spec


def autocast_dispatch(spec: ModuleSpec) -> ModuleSpec:
    """A mixture of experts' tokens dispatched in autocast's dtype (experts.AutocastDispatchMoELayer)."""
    spec.submodules.mlp = _with_module(spec.submodules.mlp, AutocastDispatchMoELayer)
    return spec


def grouped_row_parallel(spec: ModuleSpec) -> ModuleSpec:
    """The attention output and MLP down projections handing their matmul their own TP group."""
    attention_parts(spec).linear_proj = mlp_parts(spec).linear_fc2 = GroupedRowParallelLinear
    return spec


def core_attention(attention: str, te_causal: bool = True) -> Converter:
    """Our core attention `attention` (te, sdpa; local keeps megatron-core's); te with `te_causal`
    False: Transformer Engine's for packed rows alone, PyTorch's for causal rows."""
    def convert(spec):
        if attention in CORE_ATTENTION:
            attention_parts(spec).core_attention = (TEPackedCoreAttention if attention == "te" and not te_causal
                                                    else CORE_ATTENTION[attention])
        return spec
    return convert


def fused_qkv_attention(spec: ModuleSpec) -> ModuleSpec:
    """An attention handing its QKV projection's bias on to the fused split and RoPE
    (FusedQKVSelfAttention; the config's fused_single_qkv_rope with it)."""
    spec.submodules.self_attention = _with_module(spec.submodules.self_attention, FusedQKVSelfAttention)
    return spec


def fp8_linears(spec: ModuleSpec) -> ModuleSpec:
    """Transformer Engine's linear layers, which run under its FP8 autocast (the same parameter names),
    in an attention fit for them (FP8SelfAttention)."""
    spec.submodules.self_attention = _with_module(spec.submodules.self_attention, FP8SelfAttention)
    attention, mlp = attention_parts(spec), mlp_parts(spec)
    attention.linear_qkv = mlp.linear_fc1 = fp8_linear("TEColumnParallelLinear")
    attention.linear_proj = mlp.linear_fc2 = fp8_linear("TERowParallelLinear")
    return spec


def sequence_parallel_norms(qk_norm: bool) -> Converter:
    """Our RMSNorm for the norms of the sequence-split stream, and for Qwen3's QK norms (`qk_norm`),
    which see whole sequences; megatron-core's torch wrapper refuses sequence parallelism."""
    def convert(spec):
        spec.submodules.input_layernorm = spec.submodules.pre_mlp_layernorm = RMSNorm
        if qk_norm:
            attention = attention_parts(spec)
            attention.q_layernorm = attention.k_layernorm = ModuleSpec(module=RMSNorm,
                                                                      params={"sequence_split": False})
        return spec
    return convert
