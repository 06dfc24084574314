"""The spec of a layer: megatron-core's local spec for the shape, then our converters."""

from __future__ import annotations

import functools

from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

from ..plan import RunPlan
from ..shapes import ModelShape
from . import transformer
from .converters import (Converter, autocast_dispatch, core_attention, fp8_linears, fused_qkv_attention,
                         grouped_experts, grouped_row_parallel, seeded_layers, sequence_parallel_norms)
from .layers import RMSNorm


def local_spec(preset: ModelShape) -> ModuleSpec:
    """megatron-core's local layer for `preset`: RMSNorm, QK norms where Qwen3 has them, its experts."""
    return get_gpt_layer_local_spec(num_experts=preset.num_experts or None, moe_grouped_gemm=False,
                                    qk_layernorm=preset.qk_norm, normalization="RMSNorm")


def layer_converters(plan: RunPlan, stage: int = 0) -> list[Converter]:
    """What changes in the local layer, in order: seeded layers; a mixture of experts' tokens sent in
    autocast's dtype and its experts by grouped GEMM (or one after another); the row-parallel linears
    with their group; our core attention; the QKV split and RoPE fused where the config fuses them;
    under FP8 Transformer Engine's linears; under sequence parallelism our norms. `stage`: the pipeline
    stage built, whose layers follow the earlier stages'."""
    shape = plan.shape
    return [
        seeded_layers(plan.seed, plan.layer_offset(stage)),
        *([autocast_dispatch] if shape.moe else []),
        *([grouped_experts] if shape.moe and plan.grouped_experts else []),
        grouped_row_parallel,
        core_attention(plan.attention, plan.te_causal),
        *([fused_qkv_attention] if transformer.fused_qkv_rope(plan) else []),
        *([fp8_linears] if plan.fp8 else []),
        *([sequence_parallel_norms(shape.qk_norm)] if plan.sequence_parallel else []),
    ]


def layer_spec(plan: RunPlan, stage: int = 0) -> ModuleSpec:
    """The local layer of pipeline stage `stage` with `layer_converters` applied."""
    return functools.reduce(lambda spec, converter: converter(spec), layer_converters(plan, stage),
                            local_spec(plan.shape))


def block_spec(plan: RunPlan, stage: int = 0):
    """The decoder's spec of pipeline stage `stage`: its layers, and under sequence parallelism our
    RMSNorm as the final norm too (megatron-core would pick its torch wrapper)."""
    spec = layer_spec(plan, stage)
    if not plan.sequence_parallel:
        return spec
    return TransformerBlockSubmodules(layer_specs=[spec] * plan.stage_layers[stage], layer_norm=RMSNorm)
